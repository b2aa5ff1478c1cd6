#!/usr/bin/env python3
"""Replay DLQ messages to the exchange they came from - only when asked, never automatically.
See amqp_lab.cli.replay (installed as amqp-lab-replay); --help lists every option."""

from __future__ import annotations

from _cli import run

from amqp_lab.cli.replay import main

if __name__ == "__main__":
    run(main)
