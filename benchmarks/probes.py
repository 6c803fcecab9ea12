"""Per-process counters for the per-step budget: Postgres transactions, statements and round
trips (SQLAlchemy engine events), Celery messages published and tasks run (Celery signals), and
the process's memory (``/proc/self/status``).

``install()`` is called by ``benchmarks.app`` on import, so every benchmark worker and the
harness itself count from their start; a worker reports its counters through the
``bench_stats`` remote-control command (``benchmarks.app``), the harness reads its own with
``snapshot()``. The cost is a dict update under a lock per statement (~1 µs, < 0.1 % of a step).

What is counted, per process:

* ``statements`` — every ``cursor.execute`` SQLAlchemy issues (SAVEPOINT / RELEASE included);
  an ``executemany`` counts once here and its parameter sets in ``executemany_rows``;
* ``commits`` / ``rollbacks`` — transactions that executed at least one statement and ended in
  COMMIT / ROLLBACK (psycopg2 sends neither for an empty transaction);
* ``autocommit_statements`` — statements run on an AUTOCOMMIT connection: each is a Postgres
  transaction of its own, with no BEGIN and no COMMIT on the wire;
* ``round_trips`` — statements + one BEGIN and one COMMIT/ROLLBACK per counted transaction
  (psycopg2 sends BEGIN as its own round trip before the first statement);
* ``published`` / ``tasks_run`` — Celery ``before_task_publish`` / ``task_prerun``.

With ``HARVEST_BENCH_STATEMENTS=1`` in the environment (workers inherit it), every statement is
also counted by its first line's first 90 characters (``snapshot()["statements"]``): which
statements a path sends, for a profile (``benchmarks/profile_admission.py``).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

_counts: Counter[str] = Counter()
_lock = threading.Lock()
_installed = False
_texts: Counter[str] | None = Counter() if os.environ.get("HARVEST_BENCH_STATEMENTS") else None


def _add(key: str, n: int = 1) -> None:
    with _lock:
        _counts[key] += n


def _autocommit(conn: Any) -> bool:
    """Whether the driver connection is in autocommit (however it got there: an execution
    option, or an engine created with ``isolation_level="AUTOCOMMIT"``)."""
    try:
        return bool(conn.connection.dbapi_connection.autocommit)
    except Exception:  # noqa: BLE001 - a counter never breaks the code it counts
        try:
            return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        except Exception:  # noqa: BLE001
            return False


def _on_execute(
    conn: Any, _cursor: Any, statement: Any, parameters: Any, _context: Any, executemany: bool
) -> None:
    if _texts is not None:
        head = " ".join(str(statement).split())[:90]
        with _lock:
            _texts[head] += 1
    if executemany:
        _add("executemany_rows", len(parameters) if parameters is not None else 0)
    if _autocommit(conn):
        _add("autocommit_statements")
    else:
        conn.info["bench_statements"] = conn.info.get("bench_statements", 0) + 1
    _add("statements")


def _on_end(kind: str) -> Any:
    def handler(conn: Any) -> None:
        if conn.info.pop("bench_statements", 0) and not _autocommit(conn):
            _add(kind)

    return handler


def install() -> None:
    """Attach the counters to every SQLAlchemy engine and to Celery's signals (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    import sqlalchemy as sa
    from celery import signals

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", _on_execute)
    sa.event.listen(sa.engine.Engine, "commit", _on_end("commits"))
    sa.event.listen(sa.engine.Engine, "rollback", _on_end("rollbacks"))
    signals.before_task_publish.connect(lambda **_kw: _add("published"), weak=False)
    signals.task_prerun.connect(lambda **_kw: _add("tasks_run"), weak=False)


def snapshot() -> dict[str, Any]:
    """This process's counters, derived round trips, and memory."""
    with _lock:
        counts = dict(_counts)
    for key in (
        "statements",
        "commits",
        "rollbacks",
        "autocommit_statements",
        "executemany_rows",
        "published",
        "tasks_run",
    ):
        counts.setdefault(key, 0)
    counts["round_trips"] = counts["statements"] + 2 * (counts["commits"] + counts["rollbacks"])
    counts["pg_transactions"] = counts["commits"] + counts["autocommit_statements"]
    out: dict[str, Any] = {"pid": os.getpid(), "counters": counts, **memory(os.getpid())}
    if _texts is not None:
        with _lock:
            out["statements"] = dict(_texts)
    return out


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in KiB, from /proc (Linux); {} elsewhere."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key.lower() + "_kib"] = int(value.split()[0])
    except OSError:
        pass
    return out


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}
