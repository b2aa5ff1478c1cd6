#!/usr/bin/env bash
# Build a local RabbitMQ image without any image registry (none is reachable on our machines):
# debootstrap a minimal Debian with Debian's rabbitmq-server, enable the management plugin offline,
# let guest connect from outside the container, and `docker import` the tree.
#   SUITE=bookworm -> RabbitMQ 3.10.x ; SUITE=trixie -> RabbitMQ 4.0.x
# Usage: scripts/build_test_image.sh [SUITE] [IMAGE]
set -euo pipefail
suite=${1:-bookworm}
image=${2:-amqp-lab/rabbitmq:${suite}}
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "image $image already present"
  exit 0
fi
rootfs=$(mktemp -d /tmp/amqp-lab-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap $suite into $rootfs (about a minute)"
debootstrap --variant=minbase --include=rabbitmq-server "$suite" "$rootfs" >"$rootfs.log" 2>&1 \
  || { tail -20 "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
printf '[rabbitmq_management,rabbitmq_consistent_hash_exchange].\n' >"$rootfs/etc/rabbitmq/enabled_plugins"
mkdir -p "$rootfs/etc/rabbitmq/conf.d"
# Same default as the official image: guest may connect from outside the container.
printf 'loopback_users.guest = false\n' >"$rootfs/etc/rabbitmq/conf.d/10-defaults.conf"
tar -C "$rootfs" -c . | docker import \
  --change 'CMD ["rabbitmq-server"]' \
  --change 'EXPOSE 5672 15672' \
  - "$image" >/dev/null
echo "built $image"
