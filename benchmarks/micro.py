"""In-process micro-benchmarks (scenario ``micro``): the pure ``decide()`` against history
length (cold replay and warm session), the payload codec, and one Postgres commit (an
ingredient of the floor estimate). No worker process, no broker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import HARVEST_DB, bench_call, summary


# ── decision cost vs history length (pure, in process) ─────────────────────────────────────
def bench_decide(sizes: tuple[int, ...] = (10, 100, 1000)) -> dict[str, Any]:
    from benchmarks.app import bench_seq, bench_step
    from harvest_celery._core.engine import Activation, decide
    from harvest_celery.testing import Simulator

    sim = Simulator(bench_seq, bench_step)
    definition = sim.registry.workflow("bench_seq")
    rows = []
    for size in sizes:
        # WorkflowStarted + 3 events per completed step (Scheduled, Started, Completed): the
        # decision that follows the k-th completion, which schedules step k+1 (the live frontier).
        k = (size - 1) // 3
        run = sim.start("bench_seq", k + 10, execution_id=f"decide-{size}")
        for _ in range(k):
            run.decide()
            (scheduled,) = run.open_activities()
            run.execute(scheduled)
        activation = Activation(run.execution_id, "bench_seq", list(run.history), sim.config)
        check = decide(definition, activation, sim.registry)
        assert check.nd is None and len(check.commands) == 1 and check.outcome is None, check
        per_call = bench_call(lambda a=activation: decide(definition, a, sim.registry))
        rows.append(
            {
                "events": len(run.history),
                "completed_steps": k,
                "us_per_decision": per_call * 1e6,
                "us_per_event": per_call * 1e6 / len(run.history),
                "us_per_warm_decision": bench_warm(definition, activation, sim) * 1e6,
            }
        )
    base = rows[0]["us_per_decision"]
    for row in rows:
        row["ratio_vs_smallest"] = row["us_per_decision"] / base
    first, last = rows[0], rows[-1]
    # growth of the cost per event: ~1 linear, >> 1 super-linear, << 1 flat or sub-linear
    per_event_growth = last["us_per_event"] / first["us_per_event"]
    if last["us_per_decision"] < 2 * first["us_per_decision"]:
        shape = "flat"
    elif per_event_growth > 2:
        shape = (
            f"SUPER-linear: cost per event grows x{per_event_growth:.1f} from "
            f"{first['events']} to {last['events']} events"
        )
    elif per_event_growth < 0.5:
        shape = "sub-linear"
    else:
        shape = "linear (cost per event roughly constant)"
    return {
        "rows": rows,
        "shape": shape,
        "note": "decide() only: excludes loading and decoding the history from Postgres, "
        "which is also linear in history length",
    }


def bench_warm(definition: Any, activation: Any, sim: Any, steps: int = 8) -> float:
    """Seconds per decision of a warm execution (the sticky session the decision worker keeps):
    each step feeds the session only the three events the step appended."""
    from datetime import datetime, timezone

    from harvest_celery._core import events as ev
    from harvest_celery._core.engine import Session

    session = Session(definition, activation, sim.registry)
    now = datetime.now(timezone.utc)
    total = 0.0
    for _ in range(steps):
        (command,) = session.decision.commands
        seq = len(session.events)
        new = [
            ev.HistoryEvent(
                seq,
                ev.ActivityScheduled(
                    command.activity_id, command.activity_name, command.input, command.queue
                ),
                now,
            ),
            ev.HistoryEvent(seq + 1, ev.ActivityStarted(command.activity_id, 1, "bench"), now),
            ev.HistoryEvent(seq + 2, ev.ActivityCompleted(command.activity_id, command.input + 1), now),
        ]
        t0 = time.perf_counter()
        decision = session.advance(new, sim.config)
        total += time.perf_counter() - t0
        assert decision is not None and len(decision.commands) == 1, decision
    return total / steps


# ── payload codec cost ───────────────────────────────────────────────────────────────────────
def representative_event() -> dict[str, Any]:
    from harvest_celery._core import events as ev

    order = {
        "order_id": "ord_9f3c2a71",
        "customer": {
            "id": "cus_1042",
            "email": "ada@example.com",
            "name": "Ada Lovelace",
            "address": {
                "line1": "12 Analytical Row",
                "city": "London",
                "postcode": "N1 9GU",
                "country": "GB",
            },
        },
        "items": [
            {
                "sku": f"SKU-{i:05d}",
                "qty": i % 3 + 1,
                "unit_price_cents": 1299 + 37 * i,
                "title": f"Widget model {i} with a reasonably descriptive title",
            }
            for i in range(6)
        ],
        "currency": "GBP",
        "notes": "Leave at the side door.",
    }
    return ev.ActivityScheduled("act-000001", "charge_payment", order, "payments").to_data()


def bench_codec() -> dict[str, Any]:
    from cryptography.fernet import Fernet

    from harvest_celery import FernetCodec
    from harvest_celery._payloads.pipeline import Payloads

    data = representative_event()
    size = len(json.dumps(data, separators=(",", ":")).encode())
    plain = Payloads()
    fernet = Payloads(FernetCodec({"k1": Fernet.generate_key()}, "k1"))

    def roundtrip(p: Payloads) -> Callable[[], Any]:
        return lambda: p.decode_event(p.encode_event(data, "exec-1/0001"))

    assert roundtrip(fernet)() == data and roundtrip(plain)() == data
    encoded = fernet.encode_event(data, "exec-1/0001")
    rows = {
        "plain_us": bench_call(roundtrip(plain)) * 1e6,
        "fernet_us": bench_call(roundtrip(fernet)) * 1e6,
        # context: the JSON round trip every event pays anyway on its way into/out of Postgres
        "json_roundtrip_us": bench_call(lambda: json.loads(json.dumps(data))) * 1e6,
    }
    rows["fernet_encode_us"] = bench_call(lambda: fernet.encode_event(data, "exec-1/0001")) * 1e6
    rows["fernet_decode_us"] = bench_call(lambda: fernet.decode_event(encoded)) * 1e6
    return {
        "event_bytes": size,
        "encoded_event_bytes": len(json.dumps(encoded, separators=(",", ":")).encode()),
        **rows,
    }


# ── floor ingredients: one Postgres commit ───────────────────────────────────────────────────
def bench_commit(n: int = 200) -> dict[str, Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{HARVEST_DB}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS bench_commit (i int, at timestamptz)"))
    samples = []
    with engine.connect() as conn:
        for i in range(n):
            t0 = time.perf_counter()
            conn.execute(sa.text("INSERT INTO bench_commit VALUES (:i, now())"), {"i": i})
            conn.commit()
            samples.append(time.perf_counter() - t0)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE bench_commit"))
    engine.dispose()
    return summary(samples)


def run(_args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fn in (("decide", bench_decide), ("codec", bench_codec), ("commit", bench_commit)):
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - e.g. an engine internal renamed: say so, go on
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
