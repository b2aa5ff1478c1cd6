"""The key distribution report against a real broker: the probe learns RabbitMQ's own
key -> shard placement (stable, every shard used, equal to real named shard queues bound in
the same order), a missing plugin is a clear error, and scripts/keys.py exits 2 on a hot key
of a skewed sample, 0 on a uniform one, and reads the real shard queues with --live."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from amqp_lab.connection import open_channel
from amqp_lab.errors import TopologyError
from amqp_lab.management import ManagementClient
from amqp_lab.ordering import probe
from amqp_lab.ordering.key_sources import zipf_sample
from amqp_lab.ordering.probe import PLUGIN_MISSING, probe_placement
from amqp_lab.settings import BrokerSettings
from tests.brokers import TestBroker
from tests.support import run_script, strict_json, wait_for, wait_ready_count

pytestmark = pytest.mark.integration

PLUGIN = "rabbitmq_consistent_hash_exchange"
KEYS = [f"customer-{i}" for i in range(200)]


@pytest.fixture
def chx(broker: TestBroker, vhost: BrokerSettings) -> Iterator[BrokerSettings]:
    """The vhost, on a broker with the consistent-hash exchange plugin (enabled here on a
    test container whose image lacks it)."""
    try:
        probe_placement(vhost, ["k"], 1)
    except TopologyError as e:
        if str(e) != PLUGIN_MISSING:
            raise
        if not broker.plugins_enable(PLUGIN):
            pytest.skip(f"{PLUGIN} is not enabled on the {broker.kind} test broker")
    yield vhost


def write(path: Path, keys: list[str]) -> str:
    path.write_text("".join(f"{k}\n" for k in keys))
    return str(path)


def test_probe_places_each_key_on_one_shard_stably(chx: BrokerSettings) -> None:
    first = probe_placement(chx, KEYS, 4, 20)
    second = probe_placement(chx, list(reversed(KEYS)), 4, 20)
    assert set(first.shard_of) == set(KEYS)
    assert set(first.shard_of.values()) == {1, 2, 3, 4}
    assert first.shard_of == second.shard_of and first.method == "probe"
    with ManagementClient(chx) as api:  # nothing left behind (management stats lag: poll)
        wait_for(lambda: not api.queues(chx.vhost), what="probe queues deleted")
        wait_for(
            lambda: not [x for x in api.bindings(chx.vhost) if "probe" in x["source"]],
            what="probe exchange deleted",
        )


def test_the_probe_matches_named_shard_queues_bound_in_order(chx: BrokerSettings) -> None:
    """The ring hashes the routing key and numbers buckets by binding order: queue names do
    not matter, so the probe's server-named queues give the real shards' placement."""
    real: dict[str, int] = {}
    with open_channel(chx) as channel:
        channel.confirm_delivery()
        channel.exchange_declare("tasks.ordered", "x-consistent-hash", durable=True)
        for n in range(1, 5):
            channel.queue_declare(f"q:tasks:shard:{n}", durable=True)
            channel.queue_bind(f"q:tasks:shard:{n}", "tasks.ordered", routing_key="20")
        for key in KEYS:
            props = pika.BasicProperties(headers={"key": key})
            channel.basic_publish("tasks.ordered", key, b"", props, mandatory=True)
        for n in range(1, 5):
            while (got := channel.basic_get(f"q:tasks:shard:{n}", auto_ack=True))[0]:
                real[got[0].routing_key] = n
    assert real == probe_placement(chx, KEYS, 4, 20).shard_of


def test_an_unknown_exchange_type_is_a_clear_error(
    chx: BrokerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "EXCHANGE_TYPE", "x-amqp-lab-no-such-type")
    with pytest.raises(TopologyError) as caught:
        probe_placement(chx, KEYS[:3], 2)
    assert str(caught.value) == PLUGIN_MISSING


def test_report_warns_on_a_skewed_sample_and_not_on_a_uniform_one(
    chx: BrokerSettings, tmp_path: Path
) -> None:
    skewed = write(tmp_path / "skewed.txt", zipf_sample(200, 4000, 1.2))
    result = run_script(chx, "keys.py", "report", "--sample", skewed)
    assert result.returncode == 2, result.stderr
    assert "WARN hot-key: key 'key-0001'" in result.stdout
    assert "placement: probe" in result.stdout
    uniform = write(tmp_path / "uniform.txt", zipf_sample(400, 4000, 0.0))
    result = run_script(chx, "keys.py", "report", "--sample", uniform)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN" not in result.stdout


def test_report_live_reads_the_shard_queues(chx: BrokerSettings) -> None:
    with open_channel(chx) as channel:
        channel.confirm_delivery()
        for n in range(1, 5):
            channel.queue_declare(f"q:tasks:shard:{n}")
        for n, count in ((1, 1), (2, 1), (3, 1), (4, 7)):
            for _ in range(count):
                channel.basic_publish("", f"q:tasks:shard:{n}", b"x")
    with ManagementClient(chx) as api:
        wait_for(
            lambda: (api.queue(chx.vhost, "q:tasks:shard:4") or {}).get("messages") == 7,
            what="management stats of shard 4",
        )
    result = run_script(chx, "keys.py", "report", "--live", "--shard-threshold", "0.5")
    assert "WARN hot-shard: shard 4" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 2


def test_report_audit_reads_key_headers_and_leaves_the_messages(topology: BrokerSettings) -> None:
    audit = "q:tasks:audit"
    with open_channel(topology) as channel:
        channel.confirm_delivery()
        for key in ["hot"] * 8 + ["a", "b"]:
            channel.basic_publish("", audit, b"{}", pika.BasicProperties(headers={"key": key}))
        channel.basic_publish("", audit, b"{}")  # no key header
    result = run_script(topology, "keys.py", "report", "--audit", "--offline", "--json")
    assert result.returncode == 2, result.stderr
    report = strict_json(result.stdout)
    assert (report["messages"], report["distinct_keys"], report["unkeyed"]) == (10, 3, 1)
    top = report["top_keys"][0]
    assert (top["key"], top["count"], top["share"]) == ("hot", 8, 0.8)
    assert {"hot-key", "hot-shard", "few-keys"} == {w["kind"] for w in report["warnings"]}
    wait_ready_count(topology, audit, 11)


def test_report_audit_reads_a_stream_audit_from_its_first_offset(vhost: BrokerSettings) -> None:
    from amqp_lab.topology import apply_topology, load_topology
    from amqp_lab.topology.stream_audit import with_stream_audit

    apply_topology(vhost, with_stream_audit(load_topology()))
    with open_channel(vhost) as channel:
        channel.confirm_delivery()
        for key in ["hot"] * 8 + ["a", "b"]:
            properties = pika.BasicProperties(headers={"key": key})
            channel.basic_publish("tasks", "task", b"{}", properties)
    for _ in range(2):  # a stream is read, never consumed: the second report is the same
        result = run_script(vhost, "keys.py", "report", "--audit", "--offline", "--json")
        assert result.returncode == 2, result.stdout + result.stderr
        report = strict_json(result.stdout)
        assert (report["messages"], report["distinct_keys"]) == (10, 3)
        assert report["top_keys"][0]["key"] == "hot"
