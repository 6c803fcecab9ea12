"""Real Postgres, real Redis, real Celery worker processes — shared by the whole session.

One fresh database per session (migrated from empty with Alembic); two worker processes on
different queues, started as subprocesses with their queues named; Redis DB 5 flushed at start.
Every process the suite runs uses small pools (``SUITE_POOLS``), and the session fails if the
server's client connections ever went above ``MAX_CONNECTIONS`` (``ConnectionPeak``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from tests.integration import brokers
from tests.processes import kill_group, reap, stop_group, strays
from tests.require_services import missing

ROOT = Path(__file__).resolve().parents[2]
ADMIN_URL = os.environ.get("HARVEST_TEST_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
DB_NAME = os.environ.get("HARVEST_TEST_DB", "harvest_it")
DATABASE_URL = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{DB_NAME}"
# Separate sessions (or CI beside a developer's run) need their own database, Redis DB and ports.
# The broker variable names the broker only; on RabbitMQ the run's vhost is its own (brokers.py).
BROKER_GIVEN = brokers.broker(dict(os.environ))
ON_RABBITMQ = brokers.is_amqp(BROKER_GIVEN)
VHOST = brokers.vhost_name(DB_NAME) if ON_RABBITMQ else None
BROKER_URL = brokers.with_vhost(BROKER_GIVEN, VHOST) if VHOST else BROKER_GIVEN
REDIS_URL = brokers.redis_url(dict(os.environ))  # effects, counters, result backend: never the broker
LOG_DIR = Path(os.environ.get("HARVEST_TEST_LOGS", "/tmp/harvest-it-logs"))

os.environ["HARVEST_TEST_DATABASE_URL"] = DATABASE_URL
os.environ["HARVEST_TEST_BROKER_URL"] = BROKER_URL
os.environ["HARVEST_TEST_REDIS_URL"] = REDIS_URL

# Small pools for every Harvest the suite makes: in this process, and in every worker, web app
# and Flower it starts (they inherit the environment; docs/configuration.md). Each process keeps
# at most 2 + 1 connections idle and opens at most 4 + 3 (plus its one LISTEN connection).
SUITE_POOLS = {
    "HARVEST_POOL_SIZE": "2",
    "HARVEST_MAX_OVERFLOW": "2",
    "HARVEST_CLAIM_POOL_SIZE": "1",
    "HARVEST_CLAIM_MAX_OVERFLOW": "2",
}
for _name, _value in SUITE_POOLS.items():
    os.environ.setdefault(_name, _value)

# The suite must fit a Postgres left at its default max_connections (100) with room to spare
# for the server's other clients: the peak of client connections while it runs stays at or below
# this, or the session fails (pytest_sessionfinish below).
MAX_CONNECTIONS = int(os.environ.get("HARVEST_TEST_MAX_CONNECTIONS", "60"))

WORKER_QUEUES = {
    "w1": "harvest,default,alpha,payments",
    "w2": "beta,inventory,pricing",
}
_PORT = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808"))
METRICS_PORTS = {"w1": _PORT, "w2": _PORT + 1}


def _fresh_database() -> None:
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
            {"d": DB_NAME},
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DB_NAME}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{DB_NAME}"'))
    admin.dispose()


class Worker:
    def __init__(
        self,
        name: str,
        queues: str,
        extra_env: dict[str, str] | None = None,
        app: str = "tests.integration.app",
        extra_args: list[str] | None = None,
        root: Path = ROOT,
    ) -> None:
        self.name = name
        self.root = root  # the checkout it runs from (another build's, in test_upgrade.py)
        self.app = app
        self.queues = queues
        self.extra_env = extra_env or {}
        self.extra_args = list(extra_args or [])  # more `celery worker` options, e.g. ["-E"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = LOG_DIR / f"{name}.log"
        self.transport: str | None = None  # the broker its banner reports

    def start(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(self.root), **self.extra_env)
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "worker",
            "-Q",
            self.queues,
            "-n",
            f"{self.name}-{uuid.uuid4().hex[:6]}@%h",
            "-P",
            "threads",
            "-c",
            "4",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "INFO",
            *self.extra_args,
        ]
        with open(self.log, "ab") as out:
            out.write(f"\n===== start {time.time()} =====\n".encode())
            out.flush()
            marker_from = self.log.stat().st_size  # only this start's output counts
            self.proc = subprocess.Popen(
                cmd, cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait_ready(marker_from)

    def _wait_ready(self, marker_from: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited: see {self.log}")
            text = self.log.read_bytes()[marker_from:].decode(errors="replace")
            if " ready." in text:
                self.transport = brokers.transport_line(text)
                self._check_broker()
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker {self.name} not ready after {timeout}s: see {self.log}")

    def _check_broker(self) -> None:
        """On the RabbitMQ leg every worker the suite starts must report an ``amqp://`` broker
        in its banner: a Redis URL reaching a worker from the environment fails the test."""
        if ON_RABBITMQ and not (self.transport or "").startswith("amqp://"):
            self.stop()
            raise AssertionError(f"worker {self.name} reports broker {self.transport!r}, not amqp://")

    def restart(self, env: dict[str, str] | None = None) -> None:
        self.stop()
        self.extra_env.update(env or {})
        self.start()

    def kill9(self) -> None:
        assert self.proc is not None
        kill_group(self.proc)

    def stop(self) -> None:
        stop_group(self.proc)


class ConnectionPeak:
    """Samples the test server's client connections every ``interval`` seconds from a thread,
    on one connection of its own, and keeps the highest count (with where it was seen).

    It counts every client backend on the server, not only this suite's: CI runs on a machine
    where only this suite uses that server, so the server-wide count is the number that must
    fit, and the simplest one to get right (the sampler's own connection is included)."""

    QUERY = sa.text(
        "SELECT coalesce(datname, ''), count(*) FROM pg_stat_activity "
        "WHERE backend_type = 'client backend' GROUP BY 1"
    )

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak = 0
        self.at: dict[str, Any] = {}  # at the peak: the running test and the count per database
        self.samples = 0
        self.by_file: dict[str, int] = {}  # the highest count seen while each file's tests ran
        self.running_test = "(setup)"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-peak", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        engine = sa.create_engine(ADMIN_URL, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                while not self._stop.is_set():
                    counts = {str(db): int(n) for db, n in conn.execute(self.QUERY)}
                    self.samples += 1
                    total = sum(counts.values())
                    where = self.running_test.split("::", 1)[0]
                    self.by_file[where] = max(total, self.by_file.get(where, 0))
                    if total > self.peak:
                        self.peak, self.at = total, {"test": self.running_test, "by_database": counts}
                    self._stop.wait(self.interval)
        finally:
            engine.dispose()

    def report(self) -> str:
        return (
            f"connection peak: {self.peak} client connections on the test server "
            f"(limit {MAX_CONNECTIONS}; {self.samples} samples; at {self.at.get('test')}; "
            f"by database {self.at.get('by_database')})"
        )


PEAK: ConnectionPeak | None = None


@pytest.fixture(scope="session", autouse=True)
def no_stray_workers() -> None:
    """Before anything starts: kill the workers and Flower an earlier run on this database and
    broker left behind (killed before its teardown). Such a worker consumed a later run's decision
    requests and acked them against its own database (the deadlines suite, 2026-12-02). The Django
    child pytest, which runs inside a test of this session, leaves its parent's workers alone."""
    if os.environ.get("HARVEST_DJANGO_CHILD") == "1":
        return
    leftovers = strays({"HARVEST_TEST_DATABASE_URL": DATABASE_URL, "HARVEST_TEST_BROKER_URL": BROKER_URL})
    if leftovers:
        print(f"\nkilling {len(leftovers)} leftover worker process(es) of an earlier run: {leftovers}")
        reap(leftovers)


@pytest.fixture(scope="session", autouse=True)
def connection_peak() -> Iterator[ConnectionPeak | None]:
    """The whole run's connection peak (the Django child pytest, which runs inside a test of this
    session, is sampled by its parent)."""
    global PEAK
    if os.environ.get("HARVEST_DJANGO_CHILD") == "1":
        yield None
        return
    PEAK = ConnectionPeak()
    PEAK.start()
    try:
        yield PEAK
    finally:
        PEAK.stop()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if PEAK is not None:
        PEAK.running_test = nodeid


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Print the peak, write it to $HARVEST_TEST_LOGS/connection-peak.txt, and fail the session
    if it went above MAX_CONNECTIONS."""
    if PEAK is None:
        return
    PEAK.stop()
    text = PEAK.report()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    files = "".join(f"  {n:4d}  {f}\n" for f, n in sorted(PEAK.by_file.items(), key=lambda item: -item[1]))
    (LOG_DIR / "connection-peak.txt").write_text(f"{text}\nthe peak while each file ran:\n{files}")
    over = PEAK.peak > MAX_CONNECTIONS
    if over:
        text = f"FAILED: {text}: above the limit (HARVEST_TEST_MAX_CONNECTIONS)"
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(text, red=over, bold=True)
    else:
        print(text)


@pytest.fixture(autouse=True)
def give_back_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The pools of every ``Store`` a test made (a ``Harvest`` of its own, a bare ``Store``) are
    closed after it. Such a Harvest lives on after its test (its lease thread holds it for the
    life of the process), and so would its idle pooled connections: a file making a Harvest per
    test held dozens. Session and module fixtures are made before this one, so theirs stay."""
    from harvest_celery._store.store import Store

    made: list[Store] = []
    init = Store.__init__

    def recording_init(self: Store, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Store, "__init__", recording_init)
    yield
    for store in made:
        store.dispose()  # made again on next use
        blobs = getattr(store.payloads.store, "_engine", None)  # a PostgresPayloadStore's own pool
        if blobs is not None:
            blobs.dispose()


@pytest.fixture(scope="session")
def redis_client(broker_vhost: str | None) -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    return client


@pytest.fixture(scope="session")
def broker_vhost() -> Iterator[str | None]:
    """On the RabbitMQ leg, the run's vhost: created before any worker starts, deleted at the end."""
    if VHOST is None:
        yield None
        return
    why = brokers.rabbitmq_missing()
    if why:
        missing("RabbitMQ", why)
    brokers.create_vhost(VHOST)
    try:
        yield VHOST
    finally:
        brokers.delete_vhost(VHOST)


@pytest.fixture(scope="session")
def harvest(redis_client: redis.Redis) -> Any:
    _fresh_database()
    from tests.integration.app import harvest as h

    h.migrate()
    return h


@pytest.fixture(scope="session")
def workers(harvest: Any) -> Iterator[dict[str, Worker]]:
    started = {
        name: Worker(name, queues, {"HARVEST_METRICS_PORT": str(METRICS_PORTS[name])})
        for name, queues in WORKER_QUEUES.items()
    }
    try:
        for w in started.values():
            w.start()
        yield started
    finally:
        for w in started.values():
            w.stop()


@contextmanager
def worker_env(workers: dict[str, Worker], **env: str) -> Iterator[None]:
    """Every test worker restarted with ``env`` (e.g. ``HARVEST_TEST_OFFLOAD="1024"``: the
    Postgres payload store), and restarted without it afterwards, pass or fail."""
    try:
        for worker in workers.values():
            worker.restart(env)
        yield
    finally:
        for worker in workers.values():
            worker.restart(dict.fromkeys(env, ""))


@contextmanager
def workers_decide(h: Any) -> Iterator[None]:
    """Starts made through ``h`` in the block take no first decision (``eager_start`` off): a
    decision worker takes it, as without eager start. For tests of what a worker's decision
    does (sticky routing, its spans, Flower's decision tasks) or of settings only the test's
    workers have (offloading, message priority); eager start itself is tested in
    test_eager_start.py."""
    settings = h.runtime.settings
    before, settings.eager_start = settings.eager_start, False
    try:
        yield
    finally:
        settings.eager_start = before


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:12]


def effects(client: redis.Redis, tag: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.lrange(f"effects:{tag}", 0, -1)]


def wait_for(predicate: Any, timeout: float = 30, interval: float = 0.1, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def scrape_all(metric: str, **labels: str) -> float:
    """A counter summed over every worker process, as Prometheus sums its targets: a decision
    may be taken by the decision worker or inline by the activity worker that completed a step."""
    return sum(scrape(worker, metric, **labels) for worker in METRICS_PORTS)


def scrape(worker: str, metric: str, **labels: str) -> float:
    """A counter's value as the worker process serves it on /metrics, summed over the samples
    whose labels match (``path="inline"`` sums every workflow's; 0 if absent)."""
    return scrape_port(METRICS_PORTS[worker], metric, **labels)


def scrape_port(port: int, metric: str, **labels: str) -> float:
    """``scrape`` of the worker process serving /metrics on ``port``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture(scope="module")
def webapps(harvest: Any) -> Iterator[Any]:
    """The Flask shop of ``webapps.py`` (its tables made) with its own worker on its own queues:
    test_flask.py and test_transactional_start.py. Per module, so its worker's connections are
    given back before the next module (Postgres allows ~100 in all)."""
    from tests.integration import webapps as module

    with module.app.app_context():
        module.db.create_all()
        module.db.engine.dispose()
    worker = Worker(
        "webapps", f"{module.DECISION_QUEUE},{module.QUEUE}", app="tests.integration.webapps:celery"
    )
    worker.start()
    try:
        yield module
    finally:
        worker.stop()
