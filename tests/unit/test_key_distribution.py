"""The key distribution report's maths and inputs: shares, top keys, hot-key / hot-shard /
few-keys warnings, sample parsing (hostile lines named), the Zipf generator, offline placement."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_lab.errors import ConfigurationError
from amqp_lab.ordering.distribution import Thresholds, analyze, analyze_shard_counts
from amqp_lab.ordering.key_sources import keys_from_headers, parse_sample, zipf_sample
from amqp_lab.ordering.probe import offline_placement

pytestmark = pytest.mark.unit


def kinds(keys: list[str], shards: int = 4, **limits: float) -> list[tuple[str, str]]:
    placement = offline_placement(keys, shards).shard_of
    report = analyze(keys, placement, shards, thresholds=Thresholds(**limits))  # type: ignore[arg-type]
    return [(w.kind, w.subject) for w in report.warnings]


def test_counts_shares_and_top_keys() -> None:
    keys = ["a"] * 5 + ["b"] * 3 + ["c"] * 2
    report = analyze(keys, {"a": 1, "b": 2, "c": 2}, 2, top=2)
    assert report.messages == 10 and report.distinct_keys == 3
    assert [(k.key, k.count, k.share, k.shard) for k in report.top_keys] == [
        ("a", 5, 0.5, 1),
        ("b", 3, 0.3, 2),
    ]
    assert [(s.shard, s.count, s.share, s.keys) for s in report.shard_shares] == [
        (1, 5, 0.5, 1),
        (2, 5, 0.5, 2),
    ]


@given(
    st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=300),
    st.integers(min_value=1, max_value=12),
)
def test_shares_sum_to_one_and_counts_to_messages(keys: list[str], shards: int) -> None:
    report = analyze(keys, offline_placement(keys, shards).shard_of, shards, top=len(keys))
    assert sum(s.count for s in report.shard_shares) == report.messages == len(keys)
    assert sum(s.share for s in report.shard_shares) == pytest.approx(1.0)
    assert sum(k.count for k in report.top_keys) == len(keys)
    assert sum(k.share for k in report.top_keys) == pytest.approx(1.0)
    assert sum(s.keys or 0 for s in report.shard_shares) == report.distinct_keys


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=16))
def test_live_shard_shares_sum_to_one(counts: list[float]) -> None:
    report = analyze_shard_counts(counts)
    if sum(counts) > 0:
        assert sum(s.share for s in report.shard_shares) == pytest.approx(1.0)
    else:
        assert not report.warnings


def test_a_skewed_sample_warns_about_its_hot_key() -> None:
    keys = zipf_sample(200, 5000, 1.2)
    found = kinds(keys)
    assert ("hot-key", "key-0001") in found
    assert all(kind != "few-keys" for kind, _ in found)


def test_a_uniform_sample_raises_no_warning() -> None:
    keys = zipf_sample(400, 4000, 0.0)
    assert Counter(keys) == {f"key-{i:04d}": 10 for i in range(1, 401)}
    assert kinds(keys) == []


def test_a_hot_shard_and_too_few_keys() -> None:
    keys = ["a"] * 6 + ["b", "c", "d"]
    report = analyze(keys, {"a": 1, "b": 2, "c": 3, "d": 4}, 4, thresholds=Thresholds(0.9))
    assert [(w.kind, w.subject) for w in report.warnings] == [
        ("hot-shard", "shard 1"),
        ("few-keys", "4 keys"),
    ]
    assert report.warnings[0].limit == pytest.approx(1.5 / 4)
    live = analyze_shard_counts([10, 10, 10, 70], thresholds=Thresholds(shard_threshold=0.5))
    assert [w.subject for w in live.warnings] == ["shard 4"]


def test_without_placement_there_are_no_shard_shares() -> None:
    report = analyze(["a", "b"], None, 4)
    assert report.shard_shares == () and report.top_keys[0].shard is None


def test_bad_placement_and_thresholds_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="no shard"):
        analyze(["a"], {}, 2)
    with pytest.raises(ConfigurationError, match=r"not in 1\.\.2"):
        analyze(["a"], {"a": 3}, 2)
    with pytest.raises(ConfigurationError, match="key threshold"):
        Thresholds(key_threshold=0)


def test_sample_lines_and_blank_lines() -> None:
    assert parse_sample([b"a\n", b"\n", b"  b \r\n", b"   \n", b"a"]) == ["a", "b", "a"]
    assert parse_sample([]) == []


def test_sample_json_lines_with_a_field() -> None:
    lines = [b'{"key": "k1", "x": 1}\n', b"\n", b'{"key": 42}\n']
    assert parse_sample(lines) == ["k1", "42"]
    assert parse_sample([b'{"customer": "c9"}'], field="customer") == ["c9"]


@pytest.mark.parametrize(
    ("lines", "fmt", "error"),
    [
        ([b"ok\n", b"caf\xe9\n"], "auto", r"s\.txt:2: not UTF-8 \(byte 0xe9"),
        ([b'{"key": "a"}\n', b'{"id": 1}\n'], "auto", r"s\.txt:2: no field 'key'"),
        ([b'{"key": "a"}\n', b"plain\n"], "auto", r"s\.txt:2: not JSON"),
        ([b"[1, 2]\n"], "jsonl", r"s\.txt:1: a JSON list, not an object"),
        ([b'{"key": null}\n'], "jsonl", r"s\.txt:1: field 'key' is NoneType"),
        ([b"x" * 256 + b"\n"], "lines", r"s\.txt:1: key is 256 bytes"),
    ],
)
def test_hostile_sample_lines_are_named(lines: list[bytes], fmt: str, error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        parse_sample(lines, fmt=fmt, name="s.txt")  # type: ignore[arg-type]


def test_keys_from_headers_counts_the_unkeyed() -> None:
    found = keys_from_headers([{"key": "a"}, {"key": b"b\xff"}, {}, None, {"key": 3}])
    assert found.keys == ("a", "b\\xff") and found.unkeyed == 3


def test_zipf_sample_is_exact_and_reproducible() -> None:
    first = zipf_sample(50, 1000, 1.1, seed=7)
    assert len(first) == 1000 and first == zipf_sample(50, 1000, 1.1, seed=7)
    counts = Counter(first)
    assert counts.most_common(1)[0][0] == "key-0001"
    with pytest.raises(ConfigurationError):
        zipf_sample(0, 10, 1.0)


def test_offline_placement_is_stable_and_in_range() -> None:
    keys = [f"k{i}" for i in range(100)]
    one, two = offline_placement(keys, 4), offline_placement(reversed(keys), 4)
    assert one.shard_of == two.shard_of and set(one.shard_of.values()) == {1, 2, 3, 4}
    assert one.method == "offline"
