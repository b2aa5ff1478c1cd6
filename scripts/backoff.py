#!/usr/bin/env python3
"""Print backoff schedules: exponential ``base * 2**n``, capped, optionally with full jitter.

    python scripts/backoff.py --base 1 --attempts 0-5              # 1 2 4 8 16 32
    python scripts/backoff.py --base 1 --cap 30 --attempts 0-8     # ... 16 30 30 30
    python scripts/backoff.py --base 1 --attempt 3 --jitter full --samples 20

One line per wait: ``attempt=<n> wait=<seconds>``. Attempts count from 0.
"""

from __future__ import annotations

import argparse
import random

from _cli import EXIT_OK, run

from amqp_lab.cli.parser import CommandParser
from amqp_lab.retry.policy import capped, full_jitter


def attempt_range(text: str) -> range:
    """'0-5' -> range(0, 6); '3' -> range(3, 4)."""
    low, _, high = text.partition("-")
    try:
        first, last = int(low), int(high or low)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected N or N-M, got {text!r}") from e
    if first < 0 or last < first:
        raise argparse.ArgumentTypeError(f"expected 0 <= N <= M, got {text!r}")
    return range(first, last + 1)


def main() -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=float, default=1.0, help="seconds")
    parser.add_argument("--cap", type=float, default=None, help="seconds (default: no cap)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--attempts", type=attempt_range, help="N-M, e.g. 0-5")
    group.add_argument("--attempt", type=int, help="a single attempt N")
    parser.add_argument("--jitter", choices=["none", "full"], default="none")
    parser.add_argument("--samples", type=int, default=1, help="waits per attempt (jitter)")
    parser.add_argument("--seed", type=int, default=None, help="seed the jitter (repeatable)")
    args = parser.parse_args()
    if args.base < 0 or (args.cap is not None and args.cap < 0) or args.samples < 1:
        parser.error("--base and --cap must be >= 0 and --samples >= 1")
    attempts = args.attempts or range(args.attempt or 0, (args.attempt or 0) + 1)
    rng = random.Random(args.seed)
    for n in attempts:
        for _ in range(args.samples if args.jitter == "full" else 1):
            if args.jitter == "full":
                wait = full_jitter(n, args.base, args.cap, rng.uniform)
            else:
                wait = capped(n, args.base, args.cap)
            print(f"attempt={n} wait={wait:g}")
    return EXIT_OK


if __name__ == "__main__":
    run(main)
