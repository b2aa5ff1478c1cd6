"""The DLQ console: a small server-rendered web application on localhost for operating the
dead-letter queue (docs/console.md). Needs the ``console`` extra (Flask):
``pip install 'amqp-lab[console]'``; ``scripts/console.py`` serves it.

:func:`create_app` builds the Flask application; :mod:`.access` (token, CSRF, loopback),
:mod:`.present` (what a page shows) and :mod:`.actions` (the broker operations, audited) are
its parts.
"""

from amqp_lab.console.app import DEFAULT_MAX_RECORDS, DEFAULT_RATE, create_app

__all__ = ["DEFAULT_MAX_RECORDS", "DEFAULT_RATE", "create_app"]
