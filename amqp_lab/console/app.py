"""The DLQ console's Flask application (docs/console.md): the DLQ grouped by fingerprint, a
group's records, one record in full, and replay / delete with a dry run and a confirmation.

Pages are rendered on the server from templates with autoescape on: payloads, headers and
error messages are shown as text, never as markup. Every broker error becomes an error page
(404 when the DLQ is missing, 503 when the broker cannot be reached, 502 when it refused),
never a traceback, never a password.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from flask import Flask, abort, redirect, render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from amqp_lab.console.access import (
    COOKIE_NAME,
    bearer_token,
    cookie_value,
    host_is_loopback,
    same_secret,
)
from amqp_lab.console.actions import DlqActions
from amqp_lab.console.present import (
    age,
    death_rows,
    error_page,
    field_rows,
    payload_text,
    rate_from,
    short_time,
)
from amqp_lab.dlq.fingerprint import FINGERPRINT_CHARS, Group, group
from amqp_lab.errors import AmqpLabError
from amqp_lab.settings import BrokerSettings, mask_url
from amqp_lab.topology.model import Names

__all__ = ["DEFAULT_MAX_RECORDS", "DEFAULT_RATE", "create_app"]

log = logging.getLogger(__name__)

DEFAULT_MAX_RECORDS = 10_000
"""Records a page load reads at most (``--max-records``); the page says when it was capped."""
DEFAULT_RATE = 20.0
"""The replay form's default rate, messages per second."""

_FINGERPRINT = re.compile(rf"[0-9a-f]{{{FINGERPRINT_CHARS}}}")
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def create_app(
    settings: BrokerSettings,
    names: Names,
    *,
    token: str | None,
    audit_log: Path,
    queue: str | None = None,
    max_records: int = DEFAULT_MAX_RECORDS,
    default_rate: float | None = DEFAULT_RATE,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Flask:
    """The console for the DLQ ``queue`` (default ``names.dlq``) in ``settings``' vhost.

    ``token``: when set, every request must carry it (``?token=`` once, then a cookie, or
    ``Authorization: Bearer``); when None, only requests to a loopback host name are served
    (the caller refuses to bind elsewhere without a token:
    :func:`amqp_lab.console.access.check_binding`). ``audit_log``: the JSON-lines file every
    replayed or deleted record is written to. ``max_records``: records a page load reads at
    most. ``default_rate``: the replay form's messages per second (None: no limit). The
    broker is reached over AMQP only (basic.get, passive queue.declare, publish), never the
    management API, so a user with permissions on the DLQ and the replay exchanges suffices.
    """
    app = Flask(__name__)
    dlq = queue or names.dlq
    actions = DlqActions(settings, dlq, audit_log=audit_log, max_records=max_records)
    csrf = secrets.token_urlsafe(32)
    app.config["AMQP_LAB_CSRF"] = csrf
    app.config["AMQP_LAB_ACTIONS"] = actions
    # a confirmation names up to max_records message_ids (short strings: 255 bytes at most)
    app.config["MAX_FORM_MEMORY_SIZE"] = max(500_000, max_records * 1024)

    def page(status: int, title: str, message: str) -> ResponseReturnValue:
        return render_template("error.html", status=status, title=title, message=message), status

    @app.context_processor
    def common() -> dict[str, Any]:
        now = clock()
        return {
            "csrf": csrf,
            "dlq": dlq,
            "vhost": settings.vhost,
            "work_queue": names.queue,
            "short_time": short_time,
            "age": lambda value: age(value, now),
        }

    @app.before_request
    def guard() -> ResponseReturnValue | None:
        if token is None:
            if not host_is_loopback(request.host):
                return page(
                    400,
                    "host not allowed",
                    "without --token the console answers only to localhost / 127.0.0.1 / [::1]",
                )
        else:
            supplied = request.args.get("token")
            if supplied is not None:
                if not same_secret(supplied, token):
                    return page(401, "wrong access token", "the token in the address is wrong")
                if request.method in ("GET", "HEAD"):
                    return _signed_in(token)
            elif not (
                same_secret(bearer_token(request.headers.get("Authorization")), token)
                or same_secret(request.cookies.get(COOKIE_NAME), cookie_value(token))
            ):
                return page(
                    401,
                    "access token required",
                    "open the console's address with ?token=<token> once (a cookie keeps it), "
                    "or send Authorization: Bearer <token>",
                )
        if request.method == "POST" and not same_secret(request.form.get("csrf"), csrf):
            return page(
                403,
                "CSRF check failed",
                "the form's CSRF token is missing or wrong "
                "(the console was restarted?): reload the page and try again",
            )
        return None

    @app.after_request
    def harden(response: Response) -> Response:
        response.headers.update(_SECURITY_HEADERS)
        return response

    @app.errorhandler(AmqpLabError)
    def broker_error(error: AmqpLabError) -> ResponseReturnValue:
        shown = error_page(error, queue=dlq, vhost=settings.vhost)
        return page(shown.status, shown.title, shown.message)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> ResponseReturnValue:
        return page(error.code or 500, error.name, error.description or "")

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> ResponseReturnValue:
        text = mask_url(" ".join(str(error).split()))
        log.error("console: unexpected %s: %s", type(error).__name__, text)
        return page(500, "unexpected error", f"{type(error).__name__} (see the console's log)")

    def find_group(fingerprint: str) -> Group:
        if not _FINGERPRINT.fullmatch(fingerprint):
            abort(404, "not a fingerprint")
        for candidate in group(actions.snapshot().entries):
            if candidate.id == fingerprint:
                return candidate
        abort(404, f"no group {fingerprint} in the DLQ now: replayed, deleted or never there")

    @app.get("/")
    def index() -> ResponseReturnValue:
        snapshot = actions.snapshot()
        return render_template("index.html", snapshot=snapshot, groups=group(snapshot.entries))

    @app.get("/group/<fingerprint>")
    def group_page(fingerprint: str) -> ResponseReturnValue:
        return render_template("group.html", group=find_group(fingerprint))

    @app.get("/group/<fingerprint>/record")
    def record_page(fingerprint: str) -> ResponseReturnValue:
        found = find_group(fingerprint)
        message_id = request.args.get("message_id", "")
        entries = [e for e in found.entries if e.message_id == message_id]
        if not entries:
            abort(404, "no record with this message_id in the group now")
        views = [
            {
                "entry": e,
                "payload": payload_text(e),
                "headers": field_rows(e.headers),
                "properties": field_rows(e.properties),
                "deaths": death_rows(e.x_death),
            }
            for e in entries
        ]
        return render_template("record.html", group=found, message_id=message_id, views=views)

    @app.get("/group/<fingerprint>/<any(replay, delete):action>")
    def preview(fingerprint: str, action: str) -> ResponseReturnValue:
        if not _FINGERPRINT.fullmatch(fingerprint):
            abort(404, "not a fingerprint")
        message_ids = request.args.getlist("message_id") or None
        run = actions.replay if action == "replay" else actions.delete
        outcome = run(fingerprint, message_ids, dry_run=True)
        if not outcome.results:
            abort(404, "nothing of this group is in the DLQ now: replayed, deleted or changed")
        return render_template(
            "confirm.html",
            outcome=outcome,
            fingerprint=fingerprint,
            single=message_ids is not None,
            rate="" if default_rate is None else f"{default_rate:g}",
        )

    @app.post("/group/<fingerprint>/<any(replay, delete):action>")
    def confirm(fingerprint: str, action: str) -> ResponseReturnValue:
        message_ids = [m for m in request.form.getlist("message_id") if m]
        if not _FINGERPRINT.fullmatch(fingerprint) or not message_ids:
            abort(400, "a confirmation names a fingerprint and the message_ids of its dry run")
        if action == "replay":
            try:
                rate = rate_from(request.form.get("rate"))
            except ValueError as e:
                abort(400, f"rate: {e}")
            outcome = actions.replay(fingerprint, message_ids, dry_run=False, rate=rate)
        else:
            outcome = actions.delete(fingerprint, message_ids, dry_run=False)
        return render_template("result.html", outcome=outcome, fingerprint=fingerprint)

    return app


def _signed_in(token: str) -> Response:
    """Redirect to the same address without ``token=``, setting the session cookie."""
    rest = [(k, v) for k, v in request.args.items(multi=True) if k != "token"]
    target = request.path + (f"?{urlencode(rest)}" if rest else "")
    response = redirect(target)
    response.set_cookie(
        COOKIE_NAME, cookie_value(token), httponly=True, samesite="Strict", path="/"
    )
    return response
