"""The loss lab at a small size (300 messages, 2 SIGKILLs of the worker) for every design,
against the test broker's fresh vhost and the local Redis: BRPOP and auto-ack lose messages,
LMOVE + reaper, Redis Streams, manual ack and the RabbitMQ stream lose none, manual ack + dedup
applies nothing twice, and the duplicates counted are those in the effects table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis

from amqp_lab.settings import BrokerSettings
from lab.loss_lab import effects
from lab.loss_lab.report import Row
from lab.loss_lab.runner import LabConfig, Run

pytestmark = pytest.mark.integration
REDIS_URL = "redis://127.0.0.1:6379/0"
# "holding": each kill lands while the worker holds a received, unapplied message, so the
# BRPOP loss is deterministic; auto-ack loses its buffer (the broker pushed far ahead).
CONFIG = LabConfig(messages=300, kills=2, seed=7, kill_at="holding", memory_messages=500)


def redis_reachable() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def run_design(
    key: str, settings: BrokerSettings | None, tmp_path: Path
) -> tuple[Run, Row, Counter[str]]:
    lab = Run(key, CONFIG, tmp_path, settings)
    result = lab.execute()
    counts = effects.counts(lab.effects_path)
    assert result.published == 300
    # auto-ack: the first kill can lose every message left, so no later target is reached
    assert result.kills == 2 or (key == "autoack" and result.kills >= 1)
    assert result.twice == sum(1 for n in counts.values() if n > 1)  # as the table says
    assert result.effects == sum(counts.values())
    assert result.lost == 300 - len(counts)
    assert result.extra["left_after_drain"] == 0
    assert result.memory_bytes is not None and result.memory_bytes > 0
    return lab, result, counts


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", ["brpop", "lmove", "xstream", "xstream-maxlen"])
def test_redis_designs(key: str, tmp_path: Path) -> None:
    if not redis_reachable():
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: the Redis designs need it")
    lab, row, _ = run_design(key, None, tmp_path)
    if key == "brpop":
        assert row.lost > 0
    elif key == "xstream-maxlen":
        assert row.maxlen == "MAXLEN ~ 75" and row.trimmed == row.lost > 0
    else:
        assert row.lost == 0
    keys = redis.Redis.from_url(REDIS_URL).keys(lab.prefix + "*")
    assert keys == []  # the run cleaned up after itself


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", ["autoack", "manual", "dedup", "stream"])
def test_rabbitmq_designs(key: str, vhost: BrokerSettings, tmp_path: Path) -> None:
    _, row, counts = run_design(key, vhost, tmp_path)
    if key == "autoack":
        assert row.lost > 0
    else:
        assert row.lost == 0
    if key == "dedup":
        assert row.twice == 0 and set(counts.values()) == {1}
