#!/usr/bin/env python3
"""Run the worker (amqp_lab.cli.worker) with the lab handler as its default; --handler
MODULE:FUNCTION runs yours. ``python scripts/worker.py --help`` lists every option."""

from __future__ import annotations

from _cli import ROOT, run

from amqp_lab.cli.worker import main

if __name__ == "__main__":
    run(lambda: main(default_handler="lab.handler:lab_handler", state_dir=ROOT / ".state"))
