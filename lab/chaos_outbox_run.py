"""The outbox crash test's run (scripts/chaos.py --outbox): its own broker and database, the
real relay and worker commands, producers, SIGKILLs and restarts, the drain and the summary.

* The broker is a one-node RabbitMQ container of the run's own (:class:`lab.cluster.Cluster`,
  fixed ports on 127.0.0.1), so it can be killed and started again at the same address; the
  database, for PostgreSQL, a server of the run's own (:class:`lab.pg_node.PgNode`) - the
  shared one on 5432 is never restarted. Two databases: ``app`` (the producers' orders and
  outbox) and ``stage`` (the workers' dedup store, ledger and stage A's outbox).
* Relays: ``scripts/relay.py`` processes on ``app``. Stage A: ``scripts/worker.py --ordered
  --outbox`` processes with lab.chaos_outbox_handlers:stage_a (their relay threads relay
  ``stage``); stage B: ``scripts/worker.py --ordered`` on the stage-B topology.
* Events, at points of the producers' progress: SIGKILL a relay, a stage-A or a stage-B worker
  (each restarted at once), restart PostgreSQL (crash-like), restart the broker (SIGKILL its
  container, start it). A process that exits by itself is restarted and counted.
* Drain: until every committed order and its follow-up are applied and both outboxes are
  empty, or ``drain_timeout``; then SIGTERM. The summary: lab.chaos_outbox.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amqp_lab.health import queue_health
from amqp_lab.outbox.store import OutboxStore
from amqp_lab.settings import BrokerSettings
from amqp_lab.topology import apply_topology, load_topology
from amqp_lab.topology.ordered import with_ordered
from lab.chaos_outbox import Applied, outbox_invariant_holds, outbox_summary
from lab.chaos_outbox_handlers import LEDGER_DDL, STAGE_B_TOPOLOGY
from lab.chaos_outbox_producers import (
    ORDERS_DDL,
    Producers,
    connect,
    plan_transactions,
    read_committed,
)
from lab.cluster import Cluster
from lab.pg_node import PgNode, free_port

__all__ = ["OutboxChaosPlan", "run_outbox_chaos"]

ROOT = Path(__file__).resolve().parent.parent
HANDLERS = "lab.chaos_outbox_handlers"
OUTBOX_OPTIONS = ("--outbox", "--outbox-lease", "3", "--outbox-poll", "0.2")
EVENTS = ("kill-relay", "kill-worker-a", "kill-worker-b", "restart-database", "restart-broker")


@dataclass(frozen=True)
class OutboxChaosPlan:
    """The run's size: ``store`` (sqlite, postgresql), ``transactions`` by ``producers``
    threads over ``keys`` keys (every ``rollback_every``-th rolled back, every
    ``schedule_every``-th scheduled, half of those cancelled), ``relays`` relay processes,
    ``workers`` per stage over ``shards`` shards, and ``rounds`` rounds of the five events
    (the database restart on PostgreSQL only), at most ``rate`` transactions a second, so the
    events land while producers write."""

    store: str = "postgresql"
    transactions: int = 400
    keys: int = 10
    producers: int = 3
    relays: int = 2
    workers: int = 2
    shards: int = 2
    rounds: int = 1
    rollback_every: int = 8
    schedule_every: int = 5
    drain_timeout: float = 120.0
    seed: int | None = None
    rate: float = 8.0


class Processes:
    """Named subprocesses with their output in ``workdir``; SIGKILL and restart, restart the
    ones that exited, SIGTERM all."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env = workdir, env
        self.commands: dict[str, list[str]] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {}
        self.unexpected_exits: list[str] = []
        self.lock = threading.Lock()  # a kill and its restart are one step

    def start(self, name: str, command: list[str] | None = None) -> None:
        if command is not None:
            self.commands[name] = command
        self.starts[name] = self.starts.get(name, 0) + 1
        out = (self.workdir / f"{name}.out").open("ab")
        err = (self.workdir / f"{name}.err").open("ab")
        self.procs[name] = subprocess.Popen(
            self.commands[name], stdout=out, stderr=err, env=self.env, cwd=ROOT
        )
        out.close()
        err.close()

    def kill(self, name: str, rng: random.Random) -> int:
        with self.lock:
            proc = self.procs[name]
            proc.kill()
            proc.wait(30)
            time.sleep(rng.uniform(0, 0.3))
            self.start(name)
            return proc.pid

    def restart_exited(self) -> list[str]:
        with self.lock:
            return self._restart_exited()

    def _restart_exited(self) -> list[str]:
        lines = []
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.err").read_text(errors="replace").strip()[-300:]
                self.unexpected_exits.append(name)
                lines.append(f"{name} exited with {proc.returncode}; restarted ({tail!r})")
                self.start(name)
        return lines

    def stop_all(self, timeout: float = 30) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def count(self, text: str, prefix: str = "") -> int:
        """Lines containing ``text`` in the outputs of processes named ``prefix``..."""
        total = 0
        for path in self.workdir.glob(f"{prefix}*.out"):
            total += path.read_text(errors="replace").count(text)
        return total


def read_applied(url: str) -> list[Applied]:
    db = connect(url)
    try:
        rows = db.execute("SELECT stage, message_id, key, applied_at FROM ledger ORDER BY id")
        return [Applied(str(s), str(m), str(k), float(a)) for s, m, k, a in rows.fetchall()]
    finally:
        db.close()


def _execute(url: str, statements: tuple[str, ...] | list[str]) -> None:
    db = connect(url)
    try:
        for statement in statements:
            db.execute(statement)
        if not url.endswith(".sqlite3"):
            db.commit()
    finally:
        db.close()


def run_outbox_chaos(
    plan: OutboxChaosPlan, workdir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """One run (see the module doc); the summary with ``invariant_holds``."""
    started = time.monotonic()
    rng = random.Random(plan.seed)
    run_id = uuid.uuid4().hex[:8]
    amqp_port, management_port = free_port(), free_port()
    cluster = Cluster(
        size=1,
        name=f"amqp-lab-outbox-{run_id}",
        amqp_port=amqp_port,
        management_port=management_port,
    )
    node: PgNode | None = None
    processes: Processes | None = None
    events: dict[str, int] = dict.fromkeys(EVENTS, 0)
    try:
        log(f"run {run_id}: starting a broker of its own on 127.0.0.1:{amqp_port}")
        cluster.start()
        cluster.ctl(1, "enable", "rabbitmq_consistent_hash_exchange", tool="rabbitmq-plugins")
        settings: BrokerSettings = cluster.node_settings(1, "/")
        if plan.store == "postgresql":
            node = PgNode()  # its own directory: the postgres user must reach it
            node.init()
            node.start()
            app, stage = node.create_database("app"), node.create_database("stage")
        else:
            app, stage = str(workdir / "app.sqlite3"), str(workdir / "stage.sqlite3")
        log(f"databases: app {app}, stage {stage}")
        OutboxStore(app).close()
        OutboxStore(stage).close()
        _execute(app, ORDERS_DDL[plan.store])
        _execute(stage, [LEDGER_DDL[plan.store]])
        stage_a = with_ordered(load_topology(), plan.shards)
        apply_topology(settings, stage_a)
        apply_topology(settings, with_ordered(load_topology(STAGE_B_TOPOLOGY), plan.shards))
        env = dict(
            os.environ, EAI_AMQP_URL=settings.amqp_url, EAI_MGMT_URL=settings.management_base
        )
        processes = Processes(workdir, env)
        python = [sys.executable]
        relay = [*python, str(ROOT / "scripts" / "relay.py"), "--outbox-url", app]
        relay += ["--lease", "3", "--poll", "0.2", "--quiet"]
        worker = [*python, str(ROOT / "scripts" / "worker.py"), "--ordered", str(plan.shards)]
        worker += ["--dedup-url", stage, "--base", "0.05", "--cap", "0.5", "--max-attempts", "50"]
        worker += ["--store-outage", "120"]
        for i in range(plan.relays):
            processes.start(f"relay-{i}", relay)
        for i in range(plan.workers):
            processes.start(
                f"worker-a-{i}",
                [*worker, "--handler", f"{HANDLERS}:stage_a", *OUTBOX_OPTIONS],
            )
            processes.start(
                f"worker-b-{i}",
                [*worker, "--topology", str(STAGE_B_TOPOLOGY), "--handler", f"{HANDLERS}:stage_b"],
            )
        _wait_ready(settings, app, stage, plan, processes, log)
        txns = plan_transactions(
            plan.transactions, plan.keys, rng, plan.rollback_every, plan.schedule_every
        )
        producers = Producers(
            app, stage_a.names, txns, plan.producers, rng.randrange(10**6), plan.rate
        )
        kinds = [e for e in EVENTS if e != "restart-database" or node is not None]
        schedule = sorted(
            (rng.uniform(0.15, 0.85) * len(txns), kind) for kind in kinds * plan.rounds
        )
        order = [kind for _, kind in schedule]
        log(f"{len(txns)} transactions by {plan.producers} producers; events {order}")
        producers.start()

        def fire(kind: str) -> str:
            events[kind] += 1
            assert processes is not None
            if kind == "restart-database" and node is not None:
                return f"PostgreSQL restarted in {node.restart(down_for=1.0):.1f} s"
            if kind == "restart-broker":
                t0 = time.monotonic()
                cluster.kill(1)
                cluster.restart(1)
                return f"broker killed and restarted in {time.monotonic() - t0:.1f} s"
            prefix = {
                "kill-relay": "relay-",
                "kill-worker-a": "worker-a-",
                "kill-worker-b": "worker-b-",
            }[kind]
            name = rng.choice([n for n in processes.procs if n.startswith(prefix)])
            return f"SIGKILL {name} (pid {processes.kill(name, rng)}), restarted"

        firing: threading.Thread | None = None
        while schedule or producers.alive() or (firing is not None and firing.is_alive()):
            for line in processes.restart_exited():
                log(line)
            ready = schedule and (producers.done >= schedule[0][0] or not producers.alive())
            if ready and (firing is None or not firing.is_alive()):
                _, kind = schedule.pop(0)
                done = producers.done
                firing = threading.Thread(
                    target=lambda k=kind, d=done: log(f"{fire(k)} (transactions done: {d})"),
                    daemon=True,
                )
                firing.start()
            time.sleep(0.05)
        producers.join(60)
        log(f"producers done: {producers.errors} failed transaction(s) retried; draining")
        deadline = time.monotonic() + plan.drain_timeout
        while time.monotonic() < deadline:
            for line in processes.restart_exited():
                log(line)
            if _drained(app, stage):
                break
            time.sleep(0.5)
        processes.stop_all()
        summary = outbox_summary(read_committed(app), producers.rolled_back, read_applied(stage))
    finally:
        if processes is not None:
            processes.stop_all(5)
        if node is not None:
            node.remove()
        cluster.stop()
    summary.update(
        store=plan.store,
        transactions=len(txns),
        transactions_done=producers.done,
        producer_errors=producers.errors,
        key_lock_waits=producers.lock_waits,
        producer_crashes=producers.crashed,
        relays=plan.relays,
        workers_per_stage=plan.workers,
        events=events,
        unexpected_exits=len(processes.unexpected_exits),
        duplicates_skipped=processes.count("outcome=duplicate"),
        redelivered=processes.count("redelivered=true"),
        seconds=round(time.monotonic() - started, 1),
    )
    fired = all(count >= plan.rounds for kind, count in events.items() if kind in kinds)
    complete = producers.done == len(txns) and not producers.crashed
    summary["invariant_holds"] = outbox_invariant_holds(summary) and fired and complete
    return summary


def _wait_ready(
    settings: BrokerSettings,
    app: str,
    stage: str,
    plan: OutboxChaosPlan,
    processes: Processes,
    log: Callable[[str], None],
    timeout: float = 90,
) -> None:
    """Wait until every worker consumes every shard of its stage and every relay has written
    its heartbeat (the stage-A workers' relays too): chaos starts on a running system, not on
    processes still importing - a worker whose database is down while it starts exits."""
    shards = [
        *with_ordered(load_topology(), plan.shards).names.shard_queues,
        *with_ordered(load_topology(STAGE_B_TOPOLOGY), plan.shards).names.shard_queues,
    ]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in processes.restart_exited():
            log(line)
        try:
            consuming = all(queue_health(settings, q).consumers >= plan.workers for q in shards)
            relaying = [len(_status(url).relays) for url in (app, stage)]
        except Exception:  # still starting
            consuming, relaying = False, [0, 0]
        if consuming and relaying[0] >= plan.relays and relaying[1] >= 1:
            return
        time.sleep(0.3)
    log("warning: not every worker and relay was up within 90 s; starting anyway")


def _status(url: str) -> Any:
    store = OutboxStore(url)
    try:
        return store.status()
    finally:
        store.close()


def _drained(app: str, stage: str) -> bool:
    """Both outboxes empty, and every committed, uncancelled order applied with its
    follow-up."""
    try:
        for url in (app, stage):
            store = OutboxStore(url)
            try:
                if store.status().pending:
                    return False
            finally:
                store.close()
        committed = read_committed(app)
        applied = {(a.stage, a.message_id) for a in read_applied(stage)}
    except Exception:  # a database restarting: not drained yet
        return False
    return all(
        ("a", c.message_id) in applied and ("b", f"b:{c.message_id}") in applied
        for c in committed
        if c.cancelled == "no"
    )
