#!/usr/bin/env python3
"""Serve the DLQ console (docs/console.md). See amqp_lab.cli.console (installed as
amqp-lab-console, with the console extra); --help lists every option."""

from __future__ import annotations

from _cli import run

from amqp_lab.cli.console import main

if __name__ == "__main__":
    run(main)
