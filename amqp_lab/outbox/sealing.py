"""A leased row's basic properties encoded straight from its columns (pure: no I/O).

The relay's general path turns a row into an :class:`~amqp_lab.message.OutgoingMessage`
(:func:`~amqp_lab.outbox.row.message_of`), puts the stored trace context in its headers
(:func:`~amqp_lab.outbox.trace.relay_message`) and seals its properties
(:meth:`~amqp_lab.message.OutgoingMessage.sealed_properties`): two frozen objects and every
check again, per row. Rows of one application carry few distinct ``properties`` columns, and
past them a row's properties differ only in its headers, its message_id and the time:
:func:`sealed` encodes those three into the column's :class:`~amqp_lab.wire.PropertiesTemplate`,
made and checked once per distinct column. The bytes are the ones the general path sends
(tests/unit/test_outbox_sealing.py checks it on generated messages).

It answers only for a *plain* row - every column of its type, properties that seal, headers a
field table with nothing after it, a message_id and destination AMQP can carry - and None for
any other: the relay then takes the general path, whose checks name what is wrong
(RowUndecodable, UnencodableMessage). A relay whose spans record takes the general path too
(it opens a ``publish`` span per row). The publisher adds no trace context of its own to a
sealed row (``publish_sealed``): the row's stored context is its parent, and the relay's
thread has no current span of its own.
"""

from __future__ import annotations

import functools

from amqp_lab.errors import UnencodableMessage
from amqp_lab.fieldtable import FieldTableError, decode_table, encode_table
from amqp_lab.message import MAX_PROPERTIES_BYTES, OutgoingMessage, not_a_short_string
from amqp_lab.outbox.row import CACHED_PROPERTIES_CHARS, OutboxRow, RowUndecodable, property_fields
from amqp_lab.outbox.trace import stored_context
from amqp_lab.wire import PropertiesTemplate, SealedProperties

__all__ = ["sealed", "template_of"]


@functools.lru_cache(maxsize=1024)
def template_of(properties: str) -> PropertiesTemplate | None:
    """The template of a row's ``properties`` column: the properties
    :meth:`~amqp_lab.outbox.row.message_of`'s message would have, checked as
    ``sealed_properties`` checks them; None for a column that is no row's, or whose
    properties would be refused. Cached (1,024 columns; :func:`sealed` asks only for columns
    of at most :data:`~amqp_lab.outbox.row.CACHED_PROPERTIES_CHARS` characters)."""
    try:
        fields = dict(property_fields(properties))
        message = OutgoingMessage(body=b"", message_id="template", **fields)
        message.sealed_properties()
        amqp = message.properties()
        amqp.timestamp = message.timestamp  # None: each row's own time
        return PropertiesTemplate.of(amqp)
    except (RowUndecodable, UnencodableMessage, FieldTableError, TypeError):
        return None


def sealed(row: OutboxRow, now: int) -> SealedProperties | None:
    """``row``'s basic properties, encoded as the relay's general path encodes them at epoch
    second ``now``: the column's template, the row's headers (its stored trace context in
    them, any the writer put there dropped) and its message_id. None when the row is not
    plain (see the module's doc): never raises for what a row holds."""
    if not (
        type(row.message_id) is str
        and row.message_id
        and type(row.exchange) is str
        and type(row.routing_key) is str
        and type(row.properties) is str
        and type(row.headers) is bytes
        and type(row.body) is bytes
        and (row.ordering_key is None or type(row.ordering_key) is str)
        and len(row.properties) <= CACHED_PROPERTIES_CHARS
    ):
        return None  # an UndecodableText (a str of another type) included
    template = template_of(row.properties)
    if template is None or not_a_short_string(row.exchange):
        return None
    if not_a_short_string(row.routing_key):
        return None
    try:
        headers, end = decode_table(row.headers)
        if end != len(row.headers):
            return None
        if row.traceparent:
            headers = stored_context(headers, row.traceparent, row.tracestate)
        properties = template.seal(encode_table(headers) if headers else None, row.message_id, now)
    except (FieldTableError, TypeError):
        return None
    return properties if len(properties.data) <= MAX_PROPERTIES_BYTES else None
