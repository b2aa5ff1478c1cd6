"""The worker's command line without a broker: options grouped by concept, values judged by the
config classes and refused in one line naming the option (exit 2), --max-attempts from the
topology's wait queues, and main() in small functions."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from amqp_lab.cli import worker, worker_options
from amqp_lab.cli.worker_config import configs_from, option_text
from amqp_lab.cli.worker_options import OPTION_GROUPS, worker_parser
from amqp_lab.consuming.config import ConsumerConfig
from amqp_lab.ordering import OrderedConfig
from amqp_lab.topology import load_topology
from amqp_lab.topology.files import packaged
from amqp_lab.topology.ordered import with_ordered

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "lab.handler:lab_handler"


def parse(*argv: str) -> Any:
    return worker_parser("worker", HANDLER).parse_args(list(argv))


def refused(capsys: pytest.CaptureFixture[str], *argv: str, topology: Any = None) -> str:
    """The one line a refused worker option prints (exit 2)."""
    args = parse(*argv)
    with pytest.raises(SystemExit) as exit_:
        configs_from(args, topology or load_topology())
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.removeprefix("error: ").rstrip("\n")


def test_help_groups_the_options_by_concept() -> None:
    parser = worker_parser("worker", HANDLER)
    groups = {
        g.title: [a.option_strings[0] for a in g._group_actions] for g in parser._action_groups
    }
    assert groups["retries of a failed delivery"] == [
        "--retry",
        "--max-attempts",
        "--base",
        "--cap",
        "--after-dead-letter",
    ]
    assert "--dedup-url" in groups["the dedup store"]
    assert "--metrics-port" in groups["metrics and logs (docs/operating.md)"]
    assert "--handler" in groups["what it consumes and runs"]
    assert groups["options"] == ["-h"]  # nothing left ungrouped
    grouped = [o for g in groups.values() for o in g]
    # -h, the 29 options of before, the outbox relay's 6 (--outbox, --outbox-*),
    # --gc-young-threshold and --dedup-prepare
    assert len(grouped) == len(set(grouped)) == 38
    assert "--gc-young-threshold" in groups["deliveries: how many, how fast, when to stop"]
    assert "--outbox" in groups["outbox (docs/outbox.md)"]
    assert len(OPTION_GROUPS) == 8


def test_the_dedup_store_prepares_statements_unless_told_not_to() -> None:
    assert parse().dedup_prepare is True
    assert parse("--no-dedup-prepare").dedup_prepare is False


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (("--handler-warn-after", "-1"), "--handler-warn-after must be > 0 seconds (or None)"),
        (("--prefetch", "0"), "--ack-batch 1 must be within 1..--prefetch (0)"),
        (("--ack-batch", "20"), "--ack-batch 20 must be within 1..--prefetch (10)"),
        (
            ("--concurrency", "4", "--ack-batch", "5", "--prefetch", "10"),
            "--concurrency 4 x --ack-batch 5 needs a --prefetch of at least 20 (it is 10)",
        ),
        (
            ("--retry", "backoff", "--max-attempts", "11"),
            "backoff with --max-attempts 11 needs a retry exchange and 10 wait queues; the "
            "topology has 9",
        ),
        (("--retry", "backoff", "--max-attempts", "0"), "--max-attempts must be >= 1, not 0"),
        (("--retry", "backoff", "--base", "-1"), "--base and --cap must be >= 0 seconds"),
        (
            ("--retry", "backoff", "--cap", "400"),
            "--cap must be within 0..300 seconds (the wait queues' message-ttl), not 400",
        ),
        (("--store-outage", "-1"), "--store-outage must be >= 0 seconds, not -1.0"),
        (("--wait-for-queue", "-1"), "--wait-for-queue and --resubscribe-wait must be >= 0 s"),
        (("--after-dead-letter", "park"), "--after-dead-letter park is for the ordered topology"),
    ],
)
def test_a_refused_value_is_one_line_naming_the_option(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], line: str
) -> None:
    assert refused(capsys, *argv).startswith(line)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (("--concurrency", "2"), "does not take --concurrency"),
        (("--retry", "backoff"), "does not take --retry backoff"),
        (("--max-attempts", "101"), "--max-attempts must be within 1..100 (tries in the worker)"),
        (("--max-attempts", "0"), "--max-attempts must be >= 1, not 0"),
    ],
)
def test_the_ordered_worker_refuses_in_one_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], line: str
) -> None:
    assert line in refused(capsys, *argv, topology=with_ordered(load_topology(), 2))


@pytest.mark.parametrize(
    ("argv", "ordered", "option"),
    [
        (("--concurrency", "0"), False, "--concurrency"),
        (("--max-redeliveries", "0"), False, "--max-redeliveries"),
        (("--max-redeliveries", "0"), True, "--max-redeliveries"),
        (("--prefetch", "0"), True, "--prefetch"),
    ],
)
def test_a_count_below_one_is_refused_naming_its_option(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], ordered: bool, option: str
) -> None:
    """The config classes' wording may change; the line names the option and the bound."""
    topology = with_ordered(load_topology(), 2) if ordered else None
    line = refused(capsys, *argv, topology=topology)
    assert option in line and ">= 1" in line, line


def test_option_text_names_options_not_fields() -> None:
    assert option_text("ack_batch 3 must be within 1..prefetch (2)") == (
        "--ack-batch 3 must be within 1..--prefetch (2)"
    )
    assert option_text("queue_wait and retry.max_attempts, prefetch_count") == (
        "--wait-for-queue and retry.max_attempts, prefetch_count"
    )


def max_attempts(topology: Any, *argv: str) -> int:
    consumer = configs_from(parse(*argv), topology).consumer
    return consumer.retry.max_attempts


def test_max_attempts_defaults_to_the_topologys_wait_queues_plus_one(tmp_path: Path) -> None:
    assert max_attempts(load_topology(), "--retry", "backoff") == 10  # 9 wait queues
    assert max_attempts(load_topology(packaged("invoices.json")), "--retry", "backoff") == 4
    data = json.loads(packaged("invoices.json").read_text())
    data["amqp_lab"]["wait_queues"] = 2
    (tmp_path / "two.json").write_text(json.dumps(data))
    assert max_attempts(load_topology(tmp_path / "two.json"), "--retry", "backoff") == 3
    assert max_attempts(load_topology(), "--retry", "backoff", "--max-attempts", "3") == 3
    assert max_attempts(load_topology()) == 2  # requeue: one redelivery
    assert max_attempts(with_ordered(load_topology(), 2)) == 5  # tries in the worker


def test_the_configs_are_the_library_ones() -> None:
    plain = configs_from(parse("--concurrency", "3", "--ack-batch", "2"), load_topology())
    assert isinstance(plain.consumer, ConsumerConfig)
    assert (plain.consumer.prefetch, plain.queue_name) == (12, "q:tasks")
    ordered = configs_from(parse("--prefetch", "20"), with_ordered(load_topology(), 2))
    assert isinstance(ordered.consumer, OrderedConfig)
    assert ordered.consumer.prefetch == 50
    assert ordered.queue_name == "q:tasks:shard:1,q:tasks:shard:2"


def test_a_refused_dedup_retention_stays_exit_1() -> None:
    """Not an option's range but a promise (docs/dedup.md): ConfigurationError, for run()."""
    from amqp_lab.errors import ConfigurationError

    args = parse("--retention-days", "0.001")
    with pytest.raises(ConfigurationError, match="dedup retention"):
        configs_from(args, load_topology())


def function_lengths(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text())
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.end_lineno is not None
    }


@pytest.mark.parametrize("module", [worker, worker_options])
def test_the_worker_is_made_of_small_functions(module: Any) -> None:
    lengths = function_lengths(Path(module.__file__))
    assert lengths and max(lengths.values()) <= 60, lengths
    if module is worker:
        assert lengths["main"] <= 45
