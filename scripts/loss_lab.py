#!/usr/bin/env python3
"""The loss lab: the same crash scenario against each queue design, and the measured table.

    python scripts/loss_lab.py [--messages 2000] [--kills 5] [--seed 1] [--designs a,b]
                               [--memory-messages 10000] [--maxlen M] [--kill-at random|holding]
                               [--redis-url redis://127.0.0.1:6379/0] [--out-dir .state/loss-lab]

Per design: N messages published, one worker process SIGKILLed F times while it processes
(restarted after each kill), drained, then lost (published, never applied) and processed twice
are counted from the effects table (lab.loss_lab, docs/loss-lab.md). The RabbitMQ designs run in
a fresh vhost on EAI_AMQP_URL's broker (created and deleted through the management API), or in
EAI_AMQP_URL's own vhost with --use-vhost. Redis keys use the prefix amqp-lab:loss:{run}: and are
deleted at the end. Writes loss-lab.md, loss-lab.json and loss-lab.png to --out-dir. Exit 0
when every safe design lost nothing and the dedup design applied nothing twice, 5 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shutil
import tempfile
import uuid
from pathlib import Path

from _cli import EXIT_OK, ROOT, run, settings_from_env

from amqp_lab.cli.parser import CommandParser
from amqp_lab.cli.progress import Progress
from amqp_lab.management import ManagementClient
from amqp_lab.settings import BrokerSettings
from lab.loss_lab.catalog import DESIGNS
from lab.loss_lab.plot import plot
from lab.loss_lab.report import markdown, text_table, to_json
from lab.loss_lab.runner import LabConfig, Run

EXIT_UNEXPECTED = 5
SAFE = ("lmove", "xstream", "manual", "dedup", "stream")


def parse_args() -> argparse.Namespace:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, metavar="N")
    parser.add_argument("--kills", type=int, default=5, metavar="F")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--designs", default=",".join(DESIGNS), help=", ".join(DESIGNS))
    parser.add_argument("--memory-messages", type=int, default=10_000, metavar="K")
    parser.add_argument("--maxlen", type=int, default=0, help="3b's MAXLEN ~ (default N/4)")
    parser.add_argument("--kill-at", choices=["random", "holding"], default="random")
    parser.add_argument("--prefetch", type=int, default=50)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--out-dir", type=Path, default=ROOT / ".state" / "loss-lab")
    parser.add_argument("--use-vhost", action="store_true", help="EAI_AMQP_URL's vhost as is")
    args = parser.parse_args()
    args.designs = [d.strip() for d in args.designs.split(",") if d.strip()]
    unknown = [d for d in args.designs if d not in DESIGNS]
    if unknown:
        parser.error(f"unknown design(s) {unknown}; choose from {list(DESIGNS)}")
    if args.messages < 2 or args.kills < 0 or args.memory_messages < 0:
        parser.error("--messages must be >= 2, --kills and --memory-messages >= 0")
    return args


def lab_vhost(settings: BrokerSettings, use_given: bool) -> tuple[BrokerSettings, str | None]:
    """A fresh vhost for the run (returned name to delete), or the given one."""
    if use_given:
        return settings, None
    name = f"amqp-lab-loss-{uuid.uuid4().hex[:8]}"
    with ManagementClient(settings) as api:
        api.create_vhost(name)
        api.set_permissions(name, settings.management_credentials[0])
    return settings.with_vhost(name), name


def main() -> int:
    args = parse_args()
    config = LabConfig(
        messages=args.messages,
        kills=args.kills,
        seed=args.seed,
        prefetch=args.prefetch,
        maxlen=args.maxlen,
        kill_at=args.kill_at,
        memory_messages=args.memory_messages,
        redis_url=args.redis_url,
    )
    needs_broker = any(DESIGNS[d].family == "rabbit" for d in args.designs)
    settings, created = None, None
    if needs_broker:
        settings, created = lab_vhost(settings_from_env("amqp-lab loss-lab"), args.use_vhost)
    workdir = Path(tempfile.mkdtemp(prefix="loss-lab-", dir=_state()))
    rows = []
    try:
        for key in args.designs:
            print(f"running {DESIGNS[key].title} ...", flush=True)
            # on a terminal, a line on stderr counts the effects applied; nothing in a pipe
            with Progress(key, total=args.messages, unit="effects") as progress:
                rows.append(Run(key, config, workdir, settings, progress).execute())
    finally:
        if created and settings is not None:
            with ManagementClient(settings) as api:
                api.delete_vhost(created)
        shutil.rmtree(workdir, ignore_errors=True)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    version = _broker_version(settings) if settings else "n/a"
    params = {
        "messages": args.messages,
        "kills": args.kills,
        "seed": args.seed,
        "kill_at": args.kill_at,
        "work_ms": list(config.work_ms),
        "prefetch": args.prefetch,
        "memory_messages": args.memory_messages,
        "body_bytes": config.body_bytes,
        "date": when,
        "host": platform.node(),
        "rabbitmq": version,
    }
    notes = [
        f"N = {args.messages} messages of {config.body_bytes} bytes, F = {args.kills} SIGKILLs "
        f"of the worker (kill at: {args.kill_at}), work 1-5 ms per message, prefetch "
        f"{args.prefetch}, seed {args.seed}; RabbitMQ {version}; {when}.",
        f"Memory: {args.memory_messages} messages loaded into a separate key / queue and scaled "
        "to 100k (Redis MEMORY USAGE of the key; RabbitMQ: the management API's queue "
        "`memory`, after its message count settled).",
    ]
    print(text_table(rows))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "loss-lab.md").write_text(markdown(rows, notes))
    (args.out_dir / "loss-lab.json").write_text(to_json(rows, params) + "\n")
    plot(rows, args.out_dir / "loss-lab.png", f"loss lab: N={args.messages}, F={args.kills}")
    print(f"wrote {args.out_dir}/loss-lab.md, .json, .png")
    bad = [r.key for r in rows if (r.key in SAFE and r.lost) or (r.key == "dedup" and r.twice)]
    if bad:
        print(f"UNEXPECTED: {bad} lost messages (or dedup applied one twice)")
        return EXIT_UNEXPECTED
    return EXIT_OK


def _state() -> Path:
    path = ROOT / ".state"
    path.mkdir(exist_ok=True)
    return path


def _broker_version(settings: BrokerSettings) -> str:
    with ManagementClient(settings) as api:
        return str(api.overview().get("rabbitmq_version", "?"))


if __name__ == "__main__":
    run(main)
