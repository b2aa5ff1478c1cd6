#!/usr/bin/env python3
"""List the DLQ without consuming it: a table, --json or --summary, and the --alert-depth /
--alert-age checks. See amqp_lab.cli.dlq (installed as amqp-lab-dlq); --help lists every option."""

from __future__ import annotations

from _cli import run

from amqp_lab.cli.dlq import main

if __name__ == "__main__":
    run(main)
