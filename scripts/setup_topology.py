#!/usr/bin/env python3
"""Apply a topology (default: topology/definitions.json, packaged with amqp_lab) to the vhost of
EAI_AMQP_URL, idempotently, or --verify it; see amqp_lab.cli.topology."""

from __future__ import annotations

from _cli import run

from amqp_lab.cli.topology import main

if __name__ == "__main__":
    run(main)
