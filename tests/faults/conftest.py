"""Fixtures of the fault suite: a Postgres cluster and a Redis server of its own (temp
directories, ports ``HARVEST_FAULTS_PG_PORT`` = 25432 and ``HARVEST_FAULTS_REDIS_PORT`` = 26379
by default), both stopped and wiped at the end of the session; the test app
``tests.faults.app`` migrated into them; two workers — ``decider`` (queue ``harvest``: decisions
and the sweeper) and ``acts`` (queue ``faults``: every activity and compensation) — restarted
between tests when a test left one dead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from .harness import FULL, LOG_DIR, RESULTS, Faults, Worker
from .servers import Postgres, Redis

# below the kernel's ephemeral range (32768-60999 here): a port in it can be held by any
# client connection's local end, and a listener then fails to bind
PG_PORT = int(os.environ.get("HARVEST_FAULTS_PG_PORT", "25432"))
REDIS_PORT = int(os.environ.get("HARVEST_FAULTS_REDIS_PORT", "26379"))
DB_NAME = "harvest_faults"


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "faults: fault injection on servers and workers the suite owns")


def pytest_collection_modifyitems(items: list[Any]) -> None:
    if FULL:  # the library's timings: a kill waits out a 65 s lease, a lost message 30 s+
        for item in items:
            if item.fspath and "faults" in str(item.fspath):
                item.add_marker(pytest.mark.timeout(1200))


class Servers:
    def __init__(self) -> None:
        self.pg = Postgres(PG_PORT)
        self.redis = Redis(REDIS_PORT)

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{PG_PORT}/{DB_NAME}"


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    s = Servers()
    try:
        s.pg.init()
        admin = sa.create_engine(s.pg.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{DB_NAME}"'))
        admin.dispose()
        s.redis.start()
        os.environ["HARVEST_FAULTS_DATABASE_URL"] = s.database_url
        os.environ["HARVEST_FAULTS_BROKER_URL"] = s.redis.url
        yield s
    finally:
        s.redis.destroy()
        s.pg.destroy()


@pytest.fixture(scope="session")
def fa(servers: Servers) -> Any:
    """The test app module, imported once the servers' URLs are in the environment."""
    from tests.faults import app

    app.harvest.migrate()
    with app.effects_engine().begin() as conn:
        conn.execute(sa.text(app.EFFECTS_DDL))
    return app


@pytest.fixture(scope="session")
def workers(fa: Any) -> Iterator[dict[str, Worker]]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    for old in LOG_DIR.glob("*.log"):
        old.unlink()
    started = {"decider": Worker("decider", "harvest", {}), "acts": Worker("acts", "faults", {})}
    try:
        for w in started.values():
            w.start()
        yield started
    finally:
        for w in started.values():
            w.stop()
        fa.harvest.store.engine.dispose()
        fa.effects_engine().dispose()


@pytest.fixture(scope="session")
def engine(servers: Servers) -> Iterator[sa.Engine]:
    e = sa.create_engine(servers.database_url, pool_pre_ping=True)
    yield e
    e.dispose()


@pytest.fixture(scope="session", autouse=True)
def _results_file() -> None:
    """Each session writes its own rows (tests.faults.report reads them)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("")


@pytest.fixture
def faults(
    request: Any, fa: Any, workers: dict[str, Worker], servers: Servers, engine: sa.Engine
) -> Iterator[Faults]:
    client = redis.Redis.from_url(servers.redis.url)
    client.delete("faults:dup")
    for w in workers.values():  # a test that failed half-way may have left one dead
        if not w.alive():
            w.start()
    xfail = request.node.get_closest_marker("xfail")
    reason = str(xfail.kwargs.get("reason", "")).removeprefix("engine bug: ") if xfail else ""
    known_bug = f"known engine bug (xfail): {reason}" if xfail else ""
    yield Faults(fa, workers, client, engine, servers, known_bug)
    client.delete("faults:dup")
    for w in workers.values():
        if not w.alive():
            w.start()
    client.close()


def wait_for(predicate: Any, timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
