"""Names for state kept per broker and vhost (pure): which broker a settings object names, and
a file-name-safe key that never maps two (broker, vhost) pairs to one name.

A vhost name is any string (``a/b``, ``a_b``, ``a b`` and ``a%2Fb`` are four vhosts), so a
name built by replacing the characters a file name cannot hold would let two vhosts share one
file - one dedup store, whose claims would then ack the other vhost's messages as duplicates.
:func:`state_key` keeps a readable slug for people and appends a hash of the exact identity,
which is what tells pairs apart.

**The broker's identity** (:func:`broker_identity`) is every node of the AMQP URL list as
``host:port`` (host lowercased, IPv6 in brackets), deduplicated and sorted: a cluster listed in
another order is the same broker; a cluster listed with other nodes is not (give every worker
the same list, or name the store explicitly). No credentials, no vhost, no scheme (a port
speaks one protocol).
"""

from __future__ import annotations

import hashlib
import json
import re

from amqp_lab.settings import BrokerSettings

__all__ = ["DIGEST_CHARS", "SLUG_CHARS", "broker_identity", "legacy_state_key", "state_key"]

DIGEST_CHARS = 12
"""Hex digits of SHA-256 kept: 48 bits. Two pairs with the same slug share a hash with odds of
one in 2**48; a thousand pairs on one host, about two in a billion."""
SLUG_CHARS = 60
"""At most this many characters of readable slug (file names stay far below 255 bytes)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _node(host: str, port: int) -> str:
    host = host.lower()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def broker_identity(settings: BrokerSettings) -> str:
    """The broker ``settings`` names: its nodes' ``host:port``, sorted and comma-joined, e.g.
    ``rmq1:5672,rmq2:5672,rmq3:5672`` (one for a single broker). Order-independent; no
    credentials."""
    nodes = sorted({_node(node.host, node.port) for node in settings.addresses()})
    return ",".join(nodes)


def state_key(settings: BrokerSettings) -> str:
    """A file-name-safe key for (broker, vhost): ``<slug>-<hash>``, e.g.
    ``127.0.0.1-5672-a_b-3f2c0d9e1a4b``. The slug - the first node's host and port in
    :func:`broker_identity`'s order, ``+N`` for N more nodes, the vhost, unsafe characters as
    ``_``, at most :data:`SLUG_CHARS` - is for people only; the hash (:data:`DIGEST_CHARS` hex
    digits of SHA-256 over the exact broker identity and vhost) is what keeps ``a/b`` and
    ``a_b`` apart. Characters: letters, digits, ``_ . - +``."""
    identity = broker_identity(settings)
    exact = json.dumps([identity, settings.vhost], ensure_ascii=True)
    digest = hashlib.sha256(exact.encode("ascii")).hexdigest()[:DIGEST_CHARS]
    nodes = sorted(settings.addresses(), key=lambda n: _node(n.host, n.port))
    more = f"+{len(nodes) - 1}" if len(nodes) > 1 else ""
    readable = f"{_UNSAFE.sub('_', nodes[0].host.lower())}-{nodes[0].port}{more}-"
    slug = (readable + _UNSAFE.sub("_", settings.vhost))[:SLUG_CHARS]
    return f"{slug}-{digest}"


def legacy_state_key(settings: BrokerSettings) -> str:
    """The key amqp-lab 0.2 and earlier used (lossy: ``a/b`` and ``a_b`` give the same key),
    only to find their files."""
    return _UNSAFE.sub("_", f"{settings.host}-{settings.port}-{settings.vhost}")
