"""The crash test's moving parts: the paced publisher thread, the pool of worker processes, and
forced connection closes through the management API (used by scripts/chaos.py)."""

from __future__ import annotations

import queue
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from amqp_lab.errors import AmqpLabError
from amqp_lab.management import ManagementClient
from amqp_lab.message import OutgoingMessage
from amqp_lab.publishing.blocking import Publisher, PublishRetry
from amqp_lab.settings import BrokerSettings
from lab.handler import task_message


def connection_name(role: str) -> str:
    """The client-provided connection name of the publisher or a worker (management API)."""
    return f"amqp-lab chaos {role}"


class PublisherThread(threading.Thread):
    """Publishes ``count`` ok tasks with confirms; every ``dup_every``-th is published twice
    (a deliberate duplicate, so two workers get the same message_id at about the same moment).
    At most ``rate`` messages per second, so publishing overlaps the chaos. A connection lost
    mid-publish is retried by the Publisher with the same message_id (a duplicate if the broker
    had taken the message and only the confirm was lost)."""

    def __init__(
        self, settings: BrokerSettings, run_id: str, count: int, dup_every: int, rate: float
    ) -> None:
        super().__init__(name="chaos-publisher", daemon=True)
        self.settings = settings
        self.run_id, self.count, self.dup_every, self.rate = run_id, count, dup_every, rate
        self.confirmed: list[str] = []
        self.failed: list[str] = []
        self.sent = 0  # publishes that should have happened, duplicates included
        self.attempts = 0  # publishes made, retries included
        self.go = threading.Event()  # set it to start publishing (the connection is open)

    def message(self, seq: int) -> OutgoingMessage:
        """The ``seq``-th message (1-based): an ok task, message_id ``{run_id}-{seq:06d}``."""
        return task_message("ok", seq, f"{self.run_id}-{seq:06d}")

    def run(self) -> None:
        retry = PublishRetry(max_attempts=20, base=0.1, cap=2.0)
        with Publisher(self.settings, retry) as publisher:
            try:
                publisher.connect()  # now, so the chaos can find the connection
            except AmqpLabError as e:
                print(f"publisher cannot connect yet: {e}", flush=True)
            self.go.wait()
            start = time.monotonic()
            for seq in range(1, self.count + 1):
                if self.rate > 0:
                    time.sleep(max(0.0, start + seq / self.rate - time.monotonic()))
                message = self.message(seq)
                copies = 2 if self.dup_every and seq % self.dup_every == 0 else 1
                try:
                    for _ in range(copies):
                        self.sent += 1
                        publisher.publish(message)
                    self.confirmed.append(message.message_id)
                except AmqpLabError as e:
                    self.failed.append(message.message_id)
                    print(f"publish {message.message_id} failed: {e}", flush=True)
                self.attempts = publisher.attempts_made


class WorkerPool:
    """K worker processes (``command + --worker-process NAME``), each writing its outcome lines
    to its own file in ``workdir``; restarted after a SIGKILL or an unexpected exit."""

    def __init__(self, count: int, command: list[str], workdir: Path) -> None:
        self.names = [f"worker-{i}" for i in range(1, count + 1)]
        self.command, self.workdir = command, workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.outputs: list[Path] = []
        self.current: dict[str, Path] = {}  # each worker's output file now
        self.unexpected_exits = 0

    def start(self, name: str) -> None:
        out = self.workdir / f"{name}-{len(self.outputs)}.out"
        self.outputs.append(out)
        self.current[name] = out
        with out.open("wb") as stdout, (self.workdir / f"{name}.err").open("ab") as stderr:
            self.procs[name] = subprocess.Popen(
                [*self.command, "--worker-process", name], stdout=stdout, stderr=stderr
            )

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)

    def busy(self, within: float) -> list[str]:
        """Workers that reported a delivery in the last ``within`` seconds."""
        now = time.time()
        names = []
        for name, out in self.current.items():
            with suppress(FileNotFoundError):
                if out.stat().st_size and now - out.stat().st_mtime <= within:
                    names.append(name)
        return names

    def kill(self, name: str, rng: random.Random) -> int:
        """SIGKILL ``name``, wait for it, restart it after 0-0.3 s; return the killed pid."""
        proc = self.procs[name]
        proc.kill()
        proc.wait(30)
        time.sleep(rng.uniform(0, 0.3))
        self.start(name)
        return proc.pid

    def restart_exited(self) -> list[str]:
        """Restart workers that exited on their own (they should not); return lines saying so."""
        lines = []
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.unexpected_exits += 1
                err = (self.workdir / f"{name}.err").read_text(errors="replace").strip()
                lines.append(f"{name} exited with {proc.returncode}; restarted ({err[-300:]!r})")
                self.start(name)
        return lines

    def wait_all(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every worker to exit; SIGKILL stragglers."""
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def drain(self, stop_file: Path, depth: Callable[[], int]) -> int:
        """Touch ``stop_file``, wait until every worker exited idle, start them again while
        ``depth()`` (messages in the work queue) is not 0, five rounds at most. Returns the
        messages left (0 when drained)."""
        stop_file.touch()
        for _ in range(5):
            self.wait_all(120)
            if depth() == 0:
                return 0
            self.start_all()
        return depth()

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def visible_connections(api: ManagementClient, vhost: str) -> dict[str, str]:
    """Client-provided connection name -> the broker's connection name, in ``vhost``."""
    found = {}
    for c in api.connections(vhost):
        provided = (c.get("client_properties") or {}).get("connection_name")
        if provided:
            found[str(provided)] = str(c["name"])
    return found


def wait_visible(api: ManagementClient, vhost: str, names: list[str], timeout: float) -> bool:
    """Poll the management API until connections named ``names`` all show (``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(names) <= set(visible_connections(api, vhost)):
            return True
        time.sleep(0.2)
    return False


def close_connection(
    api: ManagementClient, vhost: str, name: str, give_up: Callable[[], bool]
) -> bool:
    """Force-close (320 CONNECTION_FORCED) the connection whose client-provided name is
    ``name``, polling until it shows (the management API lists a new connection after its
    first statistics, 1-5 s); False once ``give_up()`` is true first."""
    while not give_up():
        broker_name = visible_connections(api, vhost).get(name)
        if broker_name is not None:
            api.close_connection(broker_name, reason="amqp-lab chaos")
            return True
        time.sleep(0.3)
    return False


class Closer(threading.Thread):
    """Force-closes connections in the background, one request at a time, so a connection the
    management API does not list yet delays no other chaos event. A publisher close still
    pending when publishing ends closes a random worker's connection instead."""

    def __init__(
        self,
        settings: BrokerSettings,
        publisher: PublisherThread,
        workers: list[str],
        rng: random.Random,
        log: Callable[[str], None],
    ) -> None:
        super().__init__(name="chaos-closer", daemon=True)
        self.settings, self.publisher, self.workers, self.rng = settings, publisher, workers, rng
        self.log = log
        self.requests: queue.Queue[str | None] = queue.Queue()
        self.closed: Counter[str] = Counter()

    def request(self, target: str) -> None:
        """Close ``publisher`` or ``worker`` (a random one) soon."""
        self.requests.put(target)

    def finish(self) -> None:
        """Carry out the pending requests, then stop."""
        self.requests.put(None)
        self.join()

    def run(self) -> None:
        with ManagementClient(self.settings) as api:
            while (target := self.requests.get()) is not None:
                if target == "publisher":
                    done = close_connection(
                        api,
                        self.settings.vhost,
                        connection_name("publisher"),
                        lambda: not self.publisher.is_alive(),
                    )
                    if done:
                        self.closed["publisher"] += 1
                        self.log("force-closed the publisher's connection")
                        continue
                    self.log("publishing ended before its connection showed; a worker's instead")
                closed = self._close_any_worker(api, time.monotonic() + 15)
                self.log(f"force-closed {closed}'s connection" if closed else "no worker showed")

    def _close_any_worker(self, api: ManagementClient, deadline: float) -> str | None:
        """Close the connection of a random worker among those listed now; None when none
        shows before ``deadline`` (monotonic seconds)."""
        wanted = {connection_name(name): name for name in self.workers}
        while time.monotonic() < deadline:
            visible = visible_connections(api, self.settings.vhost)
            candidates = sorted(set(wanted) & set(visible))
            if candidates:
                choice = self.rng.choice(candidates)
                api.close_connection(visible[choice], reason="amqp-lab chaos")
                self.closed["worker"] += 1
                return wanted[choice]
            time.sleep(0.3)
        return None
