"""What a fault test does with the processes the suite owns: Celery workers it starts and
kill -9s, runs it starts with fault points planned, the wait for recovery and the verdict, and
the row each fault adds to the results file that ``python -m tests.faults.report`` turns into
``docs/reliability.md``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from tests.processes import kill_group, stop_group

from .invariants import Expect, Verdict, check

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("HARVEST_FAULTS_FULL") == "1"
LOG_DIR = Path(os.environ.get("HARVEST_FAULTS_LOGS", "/tmp/harvest-faults-logs"))
RESULTS = Path(os.environ.get("HARVEST_FAULTS_RESULTS", str(LOG_DIR / "results.jsonl")))
# how long runs may take to finish after a fault: the library's lease (60 s + 5) and re-send
# (30 s) timings need minutes; the CI timings seconds
RECOVERY_TIMEOUT = float(os.environ.get("HARVEST_FAULTS_RECOVERY_TIMEOUT", "600" if FULL else "90"))
RUNS = int(os.environ.get("HARVEST_FAULTS_RUNS", "4"))
# the kill tests need "threads" (the hooked pid is the worker's); "prefork" serves the broker
# tests (test_services.py -k redis), e.g. to check a Celery/kombu/redis-py combination
POOL = os.environ.get("HARVEST_FAULTS_POOL", "threads")


class Worker:
    """One ``celery worker`` process (``-P threads``) of ``tests.faults.app``. With the threads
    pool the process that runs a body or a decision is the worker's own process, so the pid a
    fault hook records names the worker to kill."""

    def __init__(self, name: str, queues: str, env: dict[str, str]) -> None:
        self.name = name
        self.queues = queues
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = LOG_DIR / f"{name}.log"
        self.starts = 0

    def start(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT), **self.env)
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.faults.app",
            "worker",
            "-Q",
            self.queues,
            "-n",
            f"{self.name}-{uuid.uuid4().hex[:6]}@%h",
            "-P",
            POOL,
            "-c",
            "4",
            "--without-mingle",
            "-l",
            "INFO",
        ]
        with open(self.log, "ab") as out:
            out.write(f"\n===== start {time.time()} =====\n".encode())
            out.flush()
            since = self.log.stat().st_size
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1
        self._wait_ready(since)

    def _wait_ready(self, since: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited at start: see {self.log}")
            if b" ready." in self.log.read_bytes()[since:]:
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker {self.name} not ready after {timeout}s: see {self.log}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        kill_group(self.proc)

    def stop(self) -> None:
        stop_group(self.proc, timeout=20)


@dataclass
class Row:
    """One fault's line in docs/reliability.md."""

    fault: str
    runs: int
    lost: int
    duplicated: int
    uncompensated: int
    recovery_s: float | None
    mode: str
    problems: list[str]
    known_bug: str = ""  # the xfail reason of the fault's test: a known engine bug
    broker: str = "Redis"  # the broker the workers ran on (test_rabbitmq.py: RabbitMQ)


def broker_of(app: Any) -> str:
    """``Redis``, ``RabbitMQ`` or ``RabbitMQ quorum``: what the app sends through now."""
    url = str(app.conf.broker_url or "")
    if not url.startswith(("amqp", "pyamqp")):
        return "Redis"
    return "RabbitMQ quorum" if app.conf.task_default_queue_type == "quorum" else "RabbitMQ classic"


class Faults:
    """A fault test's toolbox (the ``faults`` fixture)."""

    def __init__(
        self,
        fa: Any,
        workers: dict[str, Worker],
        client: redis.Redis,
        engine: sa.Engine,
        servers: Any,
        known_bug: str = "",
    ) -> None:
        self.known_bug = known_bug
        self.fa = fa
        self.harvest = fa.harvest
        self.workers = workers
        self.redis = client
        self.engine = engine
        self.servers = servers
        self.expected: dict[str, Expect] = {}

    # ── runs ─────────────────────────────────────────────────────────────────────────────────
    def start(
        self, n: int = RUNS, plan: str | None = None, plan_on: str | int = "all", **data: Any
    ) -> list[str]:
        """Start ``n`` sagas; every second one (odd index) fails at its last step and unwinds.
        ``plan``: the fault point each run hangs at (``plan_on``: "all", "failing" — each
        failing run —, or a number: the first that many runs)."""
        runs = []
        for i in range(n):
            fail = i % 2 == 1
            run = f"f-{uuid.uuid4().hex[:10]}-{i}"
            planned = (
                plan_on == "all"
                or (plan_on == "failing" and fail)
                or (isinstance(plan_on, int) and i < plan_on)
            )
            if plan and planned:
                self.redis.set(f"hang:{run}", plan)
            self._start_one(run, {**data, "fail": fail})
            self.expected[run] = Expect("FAILED", unwinds=True) if fail else Expect()
            runs.append(run)
        return runs

    def _start_one(self, run: str, data: dict[str, Any]) -> None:
        """A start, retried as a client would after a database blip: the first statement on a
        pooled connection that a Postgres restart cut fails (the store pings no connection);
        the start is idempotent by run id."""
        for attempt in range(5):
            try:
                self.harvest.start_workflow("fault_saga", data, execution_id=run)
                return
            except sa.exc.OperationalError:
                if attempt == 4:
                    raise
                time.sleep(0.5)

    def expect(self, run: str, expect: Expect) -> None:
        self.expected[run] = expect

    def wait_hung(self, runs: list[str], timeout: float = 60) -> dict[str, tuple[str, int]]:
        """Until every run in ``runs`` waits at its planned point: {run: (point, pid)}."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hung = {run: self.redis.get(f"hung:{run}") for run in runs}
            if all(hung.values()):
                out = {}
                for run, value in hung.items():
                    point, pid = value.decode().rsplit("|", 1)  # type: ignore[union-attr]
                    out[run] = (point, int(pid))
                return out
            time.sleep(0.05)
        raise AssertionError(f"runs did not reach their fault point in {timeout}s: {runs}")

    def release(self, runs: list[str]) -> None:
        for run in runs:
            self.redis.set(f"release:{run}", 1)

    def owners(self, pids: list[int]) -> list[Worker]:
        found = [w for w in self.workers.values() if w.pid in set(pids)]
        assert found, f"no worker has pid {pids}"
        return found

    def kill_and_restart(self, hung: dict[str, tuple[str, int]]) -> float:
        """kill -9 every worker holding a hung run, start it again; the time of the kill."""
        victims = self.owners([pid for _point, pid in hung.values()])
        for w in victims:
            w.kill9()
        t0 = time.monotonic()
        for w in victims:
            w.start()
        return t0

    def wait_finished(
        self, runs: list[str] | None = None, since: float | None = None, timeout: float = RECOVERY_TIMEOUT
    ) -> float | None:
        """Seconds from ``since`` until every run is terminal (nd-blocked runs count as
        settled); None if they are not within ``timeout``."""
        runs = list(self.expected) if runs is None else runs
        since = time.monotonic() if since is None else since
        deadline = time.monotonic() + timeout
        q = sa.text(
            "SELECT count(*) FROM harvest_executions WHERE id = ANY(:ids) "
            "AND status = 'RUNNING' AND nd_blocked_at IS NULL"
        )
        while time.monotonic() < deadline:
            try:
                with self.engine.connect() as conn:
                    if conn.execute(q, {"ids": runs}).scalar() == 0:
                        return round(time.monotonic() - since, 1)
            except sa.exc.OperationalError:
                pass  # the database is coming back
            time.sleep(0.2)
        return None

    # ── verdict ──────────────────────────────────────────────────────────────────────────────
    def verdict(self, fault: str, recovery: float | None) -> Verdict:
        """Check the invariants over every run this test started, require every worker alive
        (restarted if the test killed it), and add the fault's row to the results file."""
        verdict = check(self.engine, self.expected)
        for w in self.workers.values():
            if not w.alive():
                verdict.note(w.name, f"worker process lost (exit code {w.proc.poll() if w.proc else None})")
        row = Row(
            fault,
            verdict.runs,
            verdict.lost,
            verdict.duplicated,
            verdict.uncompensated,
            recovery,
            "full" if FULL else "ci",
            verdict.problems,
            self.known_bug,
            broker_of(self.harvest.celery_app),
        )
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with open(RESULTS, "a") as out:
            out.write(json.dumps(asdict(row)) + "\n")
        return verdict

    def assert_clean(self, fault: str, recovery: float | None) -> Verdict:
        verdict = self.verdict(fault, recovery)
        assert recovery is not None, f"{fault}: runs not finished in {RECOVERY_TIMEOUT}s: {verdict.problems}"
        assert verdict.clean, f"{fault}: " + "\n".join(verdict.problems)
        return verdict

    def attempt_errors(self, run: str, activity_id: str) -> list[tuple[int, str]]:
        """(attempt, error type) of every failed attempt of an activity, retried ones included."""
        with self.engine.connect() as conn:
            return [
                (int(a), str(t))
                for a, t in conn.execute(
                    sa.text(
                        "SELECT attempt, error_type FROM harvest_attempt_errors WHERE execution_id = :id "
                        "AND activity_id = :aid ORDER BY attempt"
                    ),
                    {"id": run, "aid": activity_id},
                )
            ]

    def history(self, run: str) -> list[tuple[str, dict]]:
        with self.engine.connect() as conn:
            return [
                (t, d if isinstance(d, dict) else json.loads(d))
                for t, d in conn.execute(
                    sa.text("SELECT type, data FROM harvest_events WHERE execution_id = :id ORDER BY seq"),
                    {"id": run},
                )
            ]
