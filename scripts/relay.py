#!/usr/bin/env python3
"""Run the outbox relay (amqp_lab.cli.relay): publish the committed rows of an outbox with
publisher confirms and mandatory. Without --outbox-url it relays the outbox in the worker's
default dedup store for EAI_AMQP_URL's broker and vhost. ``python scripts/relay.py --help``
lists every option; docs/outbox.md says how to run it."""

from __future__ import annotations

from _cli import ROOT, run, settings_from_env

from amqp_lab.cli.relay import main
from amqp_lab.cli.state import default_dedup_path


def default_outbox() -> str:
    """scripts/worker.py's default store: the outbox of its handlers' follow-ups."""
    return default_dedup_path(settings_from_env("amqp-lab relay"), ROOT / ".state")


if __name__ == "__main__":
    run(lambda: main(default_outbox=default_outbox))
