#!/usr/bin/env python3
"""The whole flow on a real broker, step by step, with a readable summary.

With EAI_AMQP_URL set, everything happens in that URL's vhost and nowhere else. Without it, the
demo starts scripts/broker.py's dedicated node (if it is not running) and uses a fresh vhost
``amqp-lab-demo`` on it; that node is left running, and the last lines say so and how to stop
it (``python scripts/broker.py stop``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

import httpx
from _cli import EXIT_FAILED, EXIT_OK, ROOT, run
from prometheus_client.parser import text_string_to_metric_families

from amqp_lab.cli.parser import CommandParser
from amqp_lab.errors import AmqpLabError
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings, mask_url
from lab.local_broker import LocalBroker

DEMO_VHOST = "amqp-lab-demo"
summary: list[str] = []


class DemoStopped(Exception):
    """A step's script exited with a code the demo does not expect."""


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def script(name: str, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    print(f"$ python scripts/{name} {' '.join(args)}".rstrip(), flush=True)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in (result.stdout + result.stderr).splitlines():
        print(f"    {line}")
    print(f"    (exit {result.returncode})", flush=True)
    if result.returncode not in ok:
        raise DemoStopped(f"demo stopped: scripts/{name} exited {result.returncode}")
    return result


def scraped_worker(
    *args: str, during: Callable[[], object] = lambda: None
) -> tuple[str, dict[str, list[str]]]:
    """Run worker.py with ``--metrics-port 0`` and scrape its /metrics every 0.3 s while it runs,
    calling ``during()`` (more publishing) once after the first scrape; returns its stdout and,
    per counter, the distinct totals seen in order (moving counters)."""
    command = [sys.executable, str(ROOT / "scripts" / "worker.py"), *args, "--metrics-port", "0"]
    print(f"$ python scripts/worker.py {' '.join(args)} --metrics-port 0", flush=True)
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    lines: list[str] = [worker.stdout.readline()]
    reader = threading.Thread(target=lambda: lines.extend(worker.stdout or []), daemon=True)
    reader.start()
    url = lines[0].strip().split(" ")[-1]
    seen: dict[str, list[str]] = {}
    last = ""
    scrapes = 0
    while worker.poll() is None:
        if scrapes == 1:
            during()  # while the worker runs: its counters move between two scrapes
        scrapes += 1
        try:
            text = httpx.get(url, timeout=2).text
        except httpx.HTTPError:
            break  # the worker is exiting
        last = text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in DEMO_COUNTERS:
                    key = sample.name.removeprefix("amqp_lab_consumer_")
                    key += "".join(
                        f"{{{k}={v}}}" for k, v in sorted(sample.labels.items()) if k in DETAIL
                    )
                    values = seen.setdefault(key, [])
                    if not values or values[-1] != f"{sample.value:g}":
                        values.append(f"{sample.value:g}")
        time.sleep(0.3)
    stderr = worker.stderr.read() if worker.stderr else ""
    worker.wait(timeout=60)
    reader.join(timeout=10)
    for line in "".join(lines).splitlines() + stderr.splitlines():
        print(f"    {line}")
    print("    last scrape (amqp_lab_consumer_*):")
    for line in last.splitlines():
        name = line.split("{")[0]
        if name.startswith("amqp_lab_consumer_") and not name.endswith(("_created", "_bucket")):
            print(f"      {line}")
    print(f"    (exit {worker.returncode})", flush=True)
    if worker.returncode != 0:
        raise DemoStopped(f"demo stopped: scripts/worker.py exited {worker.returncode}")
    return "".join(lines), seen


DEMO_COUNTERS = {
    f"amqp_lab_consumer_{name}_total"
    for name in ("processed", "duplicates", "requeued", "retried", "dead_lettered")
}
DETAIL = ("classification", "error_type", "attempt")


def count(text: str, needle: str) -> int:
    return sum(needle in line for line in text.splitlines())


def prepare_broker(node: LocalBroker | None, left_running: list[str]) -> None:
    """Use EAI_AMQP_URL's broker, or (``node``) the dedicated local node in a fresh vhost.
    Once that node runs, ``left_running`` says whether this demo started it."""
    if node is None:
        settings = BrokerSettings(os.environ["EAI_AMQP_URL"], os.environ.get("EAI_MGMT_URL"))
        print(f"broker from EAI_AMQP_URL: {settings.masked_url}")
        return
    print(
        f"EAI_AMQP_URL is unset: using the dedicated node {node.nodename} "
        f"(127.0.0.1:{node.amqp_port}); starting it if needed (about 10 s)",
        flush=True,
    )
    if node.is_running():
        left_running.append("it was already running")
    else:
        node.start()
        left_running.append("started by this demo")
    root = BrokerSettings(node.amqp_url, node.management_url)
    with ManagementClient(root) as api:
        api.delete_vhost(DEMO_VHOST)
        api.create_vhost(DEMO_VHOST)
        api.set_permissions(DEMO_VHOST, root.username)
    demo = root.with_vhost(DEMO_VHOST)
    os.environ["EAI_AMQP_URL"] = demo.amqp_url
    os.environ["EAI_MGMT_URL"] = node.management_url
    print(f"fresh vhost {DEMO_VHOST!r}: {demo.masked_url}")


def say_broker_left_running(node: LocalBroker, how: str) -> None:
    """The demo's last lines when it leaves the dedicated node running."""
    print(f"\nThe broker is still running ({how}): node {node.nodename},")
    print(
        f"AMQP 127.0.0.1:{node.amqp_port}, management {node.management_url} (guest/guest), "
        f"vhost {DEMO_VHOST!r}."
    )
    print(
        "To work in its vhost (dlq.py, console.py, exporter.py, worker.py): "
        f'eval "$(python scripts/broker.py env --vhost {DEMO_VHOST})"'
    )
    print("Stop it with: python scripts/broker.py stop", flush=True)


def main() -> int:
    CommandParser(description=__doc__.splitlines()[0]).parse_args()
    node = None if os.environ.get("EAI_AMQP_URL") else LocalBroker()
    left_running: list[str] = []  # how the dedicated node came to run, once it does
    try:
        return demo(node, left_running)
    except DemoStopped as e:
        print(e, file=sys.stderr, flush=True)
        return EXIT_FAILED
    except AmqpLabError as e:
        print(f"error: {mask_url(str(e))}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    finally:  # on success, failure or Ctrl-C alike: a node we leave running is named last
        if node is not None and left_running and node.is_running():
            say_broker_left_running(node, left_running[0])


def demo(node: LocalBroker | None, left_running: list[str]) -> int:
    step("1. broker")
    prepare_broker(node, left_running)

    step("2. topology (applied twice: the second run changes nothing), then verified")
    script("setup_topology.py")
    second = script("setup_topology.py")
    script("setup_topology.py", "--verify")
    summary.append(f"topology: second apply -> {second.stdout.strip().splitlines()[-1]}")

    step("3. publish with confirms + mandatory: ok x3, flaky, bad, invalid, a duplicate pair")
    confirmed = 0
    for kind, n in (("ok", "3"), ("flaky", "1"), ("bad", "1"), ("invalid", "1")):
        confirmed += count(
            script("publish.py", "--kind", kind, "--count", n).stdout, "status=confirmed"
        )
    dup = f"demo-dup-{uuid.uuid4().hex[:8]}"
    confirmed += count(
        script("publish.py", "--message-id", dup, "--count", "2").stdout, "status=confirmed"
    )
    unroutable = script("publish.py", "--routing-key", "nowhere", ok=(3,))
    summary.append(
        f"publish: {confirmed} confirmed; routing key 'nowhere' -> exit "
        f"{unroutable.returncode} (unroutable, not retried)"
    )

    step(
        "4. worker: manual ack after the work, prefetch 10, exits after 2 s idle; its "
        "/metrics scraped while it runs, and 3 more ok tasks published meanwhile"
    )
    worker, scrapes = scraped_worker(
        "--idle-exit", "2", during=lambda: script("publish.py", "--kind", "ok", "--count", "3")
    )
    summary.append(
        "metrics (scraped from the running worker): "
        + "; ".join(f"{name} {' -> '.join(values)}" for name, values in scrapes.items())
    )
    outcomes = {
        o: count(worker, f"outcome={o} ")
        for o in ("processed", "duplicate", "requeued", "retried", "dead-lettered")
    }
    summary.append("worker: " + ", ".join(f"{k}={v}" for k, v in outcomes.items()))

    step("5. DLQ: listed without consuming, as JSON, and the depth alert; health (no worker)")
    script("dlq.py")
    script("dlq.py", "--json")
    alert = script("dlq.py", "--alert-depth", "0", ok=(0, 2))
    summary.append(f"DLQ: {alert.stdout.strip()}")
    health = script("health.py", ok=(0, 2))  # what mandatory cannot see: nobody consumes
    summary.append(f"health: {health.stdout.strip().splitlines()[0]}")

    step("6. replay (explicit, never automatic): dry run, then all")
    script("replay.py", "--all", "--dry-run")
    replayed = script("replay.py", "--all")
    summary.append(f"replay: {replayed.stdout.strip().splitlines()[-1]}")
    after = script("worker.py", "--idle-exit", "2").stdout
    summary.append(
        f"after replay the cause is still there: {count(after, 'outcome=dead-lettered')} "
        "dead-lettered again (which is why nothing consumes the DLQ automatically)"
    )

    step("7. per-key order: 4 shards behind a consistent-hash exchange, single active consumer")
    script("setup_topology.py", "--ordered", "4")
    published = script("publish.py", "--ordered", "4", "--key", "order-1", "--kind", "flaky")
    keyed = [line.split()[0] for line in published.stdout.splitlines()]
    for _ in range(2):
        published = script("publish.py", "--ordered", "4", "--key", "order-1")
        keyed += [line.split()[0] for line in published.stdout.splitlines()]
    script("publish.py", "--ordered", "4", "--keys", "3", "--count", "6")
    ordered = script(
        "worker.py", "--ordered", "4", "--idle-exit", "2", "--base", "0.5", "--cap", "1"
    ).stdout
    applied = [line.split()[0] for line in ordered.splitlines() if " outcome=processed " in line]
    in_order = [m for m in applied if m in keyed] == keyed
    summary.append(
        f"ordered: order-1's flaky first message was held {count(ordered, 'outcome=retried ')} "
        f"time(s) with its 2 followers behind it; order-1 applied in publish order: {in_order}; "
        f"{len(applied)} processed"
    )

    step("8. durability: persistent vs transient messages across a real broker restart")
    durable = script("restart_demo.py", "--count", "10", ok=(0, 4))
    summary.append(f"durability: {durable.stdout.strip().splitlines()[-1]}")

    step("summary")
    for line in summary:
        print(f"  - {line}")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
