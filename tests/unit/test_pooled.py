"""Behind a transaction pooler (docs/operations.md#pgbouncer): ``pooled`` and ``listen_url`` as
settings, what listens for a store, the one log line of a process that polls, and psycopg 3
engines that never prepare on the server. No service: nothing here connects."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import harvest_celery
from harvest_celery import Harvest
from harvest_celery._runtime.settings import checked
from harvest_celery._store.dialect import Pools, pooler_options
from harvest_celery._store.listener import Listener, PollingListener, listener_of

PG = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"  # nothing listens on port 1
DIRECT = "postgresql+psycopg2://nobody@127.0.0.1:2/nowhere"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HARVEST_DATABASE_POOLED", "HARVEST_LISTEN_URL"):
        monkeypatch.delenv(name, raising=False)


def test_pooled_and_listen_url_from_keywords_and_the_environment() -> None:
    assert checked({})["pooled"] is False and checked({})["listen_url"] is None
    assert checked({}, {"HARVEST_DATABASE_POOLED": "1"})["pooled"] is True
    assert checked({}, {"HARVEST_DATABASE_POOLED": "false"})["pooled"] is False
    assert checked({}, {"HARVEST_LISTEN_URL": DIRECT})["listen_url"] == DIRECT
    assert checked({"pooled": False}, {"HARVEST_DATABASE_POOLED": "1"})["pooled"] is False  # keyword wins


@pytest.mark.parametrize(
    ("given", "env", "message"),
    [
        ({"pooled": "yes"}, {}, "pooled accepts True or False"),
        ({}, {"HARVEST_DATABASE_POOLED": "maybe"}, "HARVEST_DATABASE_POOLED='maybe': pooled accepts"),
        ({"listen_url": "redis://x"}, {}, "listen_url accepts a postgresql URL or None"),
    ],
)
def test_a_bad_value_is_refused_before_anything_is_made(given: Any, env: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        checked(given, env)


def test_what_listens_for_a_store() -> None:
    assert isinstance(listener_of(PG, None, False), Listener)
    direct = listener_of(PG, DIRECT, True)
    assert isinstance(direct, Listener) and direct.database_url == DIRECT
    assert isinstance(listener_of(PG, None, True), PollingListener)
    h = Harvest(PG, Celery("pooled", broker="memory://"), pooled=True, listen_url=DIRECT)
    assert isinstance(h.store.listener, Listener) and h.store.listener.database_url == DIRECT
    assert h.store.pools.pooled is True


def test_a_polling_process_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    polling = PollingListener(PG)
    with caplog.at_level(logging.WARNING, logger="harvest_celery"):
        for _ in range(3):
            with polling.watch("run-1") as woken:
                assert not woken.wait(0)
        polling.unsubscribe(polling.starts())
    told = [r for r in caplog.records if "nothing LISTENs" in r.getMessage()]
    assert len(told) == 1


def test_a_pooled_psycopg3_engine_never_prepares_on_the_server() -> None:
    assert pooler_options(PG, Pools(pooled=True)) == {"connect_args": {"prepare_threshold": None}}
    assert pooler_options(PG, Pools()) == {}
    assert pooler_options(DIRECT, Pools(pooled=True)) == {}  # psycopg2: none to stop


SESSION_STATE = re.compile(
    r"pg_advisory|\bSET\s+(LOCAL|SESSION)\b|['\"]\s*SET\s+\w+\s*(=|TO)\b|TEMP(ORARY)?\s+TABLE|WITH\s+HOLD|\bPREPARE\s+[a-z_]+\s+(AS|\()",
    re.IGNORECASE,
)


def test_no_state_is_kept_across_transactions() -> None:
    """Nothing harvest runs relies on its server session outliving a transaction (a pooler in
    transaction mode hands it to another client): no advisory lock, no SET, no temporary table,
    no held cursor, no PREPARE. ``LISTEN`` alone, on its own connection (``_store.listener``)."""
    root = Path(harvest_celery.__file__).parent
    found = [
        f"{path.relative_to(root)}: {match.group(0)}"
        for path in root.rglob("*.py")
        for match in SESSION_STATE.finditer(path.read_text())
    ]
    assert found == []
    listens = [p.name for p in root.rglob("*.py") if "sql.LISTEN_" in p.read_text()]
    assert listens == ["listener.py"]
