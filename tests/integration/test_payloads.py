"""Payloads on real Postgres: codecs, key rotation, offload, caps, erasure, retention.

These runs use an in-process worker on the real database (``Harvest`` with no Celery app): the
subject is the payload layer every reader and writer of history goes through, not dispatch.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from harvest_celery import (
    FernetCodec,
    FileSystemPayloadStore,
    Harvest,
    PayloadCodecError,
    PayloadStoreError,
    PostgresPayloadStore,
    WorkflowContext,
    WorkflowFailed,
    activity,
    workflow,
)
from harvest_celery._store.schema import activity_tasks, blobs, events, executions

from .conftest import DATABASE_URL

pytestmark = pytest.mark.integration

SECRET = "4111-1111-1111-1111"


@activity
def echo(value: dict) -> dict:
    return {"echo": value, "card": value.get("card")}


@activity
def blob(value: dict) -> str:
    return "z" * value["size"]


@workflow
async def pii_flow(ctx: WorkflowContext, data: dict) -> dict:
    first = await ctx.execute_activity(echo, data)
    big = await ctx.execute_activity(blob, {"size": data.get("size", 10)})
    await ctx.wait_signal("confirm") if data.get("wait") else None
    return {"first": first, "big_len": len(big)}


def make(harvest, **kwargs) -> Harvest:
    h = Harvest(DATABASE_URL, **kwargs)
    h.register(echo, blob, pii_flow)
    return h


def raw_rows(run_id: str) -> list[dict]:
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(events.c.seq, events.c.data)
            .where(events.c.execution_id == run_id)
            .order_by(events.c.seq)
        ).fetchall()
    engine.dispose()
    return [dict(seq=r.seq, data=r.data) for r in rows]


def test_round_trip_through_codec_and_offload(harvest, tag):
    key = Fernet.generate_key()
    h = make(
        harvest,
        codec=FernetCodec({"k1": key}, primary="k1"),
        payload_store=PostgresPayloadStore(),
        offload_threshold=2048,
    )
    run_id = h.start_workflow("pii_flow", {"card": SECRET, "size": 5000}, execution_id=f"codec-{tag}")
    assert h.result(run_id, timeout=30) == {
        "first": {"echo": {"card": SECRET, "size": 5000}, "card": SECRET},
        "big_len": 5000,
    }
    raw = json.dumps(raw_rows(run_id))
    assert SECRET not in raw  # encrypted at rest, in every payload field
    assert '"_harvest_codec": "fernet"' in raw and '"kid": "k1"' in raw
    assert '"_harvest_offload_envelope": 1' in raw  # the 5000-byte output went to the blob table
    decoded = [h.event for h in h.history(run_id)]
    assert decoded[0].input == {"card": SECRET, "size": 5000}
    assert [e.output for e in decoded if e.type == "ActivityCompleted"][1] == "z" * 5000
    assert h.describe(run_id).input == {"card": SECRET, "size": 5000}


def test_filesystem_payload_store_round_trip(harvest, tag, tmp_path):
    h = make(harvest, payload_store=FileSystemPayloadStore(tmp_path), offload_threshold=1024)
    run_id = h.start_workflow("pii_flow", {"size": 3000}, execution_id=f"fs-{tag}")
    assert h.result(run_id, timeout=30)["big_len"] == 3000
    assert len(list(tmp_path.iterdir())) >= 1
    assert [e.event.output for e in h.history(run_id) if e.event.type == "ActivityCompleted"][1] == "z" * 3000


def test_key_rotation_old_keys_still_decrypt(harvest, tag):
    old, new = Fernet.generate_key(), Fernet.generate_key()
    before = make(harvest, codec=FernetCodec({"old": old}, primary="old"))
    first = before.start_workflow("pii_flow", {"card": SECRET}, execution_id=f"rot1-{tag}")
    before.result(first, timeout=30)
    rotated = make(harvest, codec=FernetCodec({"old": old, "new": new}, primary="new"))
    second = rotated.start_workflow("pii_flow", {"card": SECRET}, execution_id=f"rot2-{tag}")
    rotated.result(second, timeout=30)
    assert rotated.history(first)[0].event.input["card"] == SECRET  # written with the old key
    assert '"kid": "new"' in json.dumps(raw_rows(second)) and '"kid": "new"' not in json.dumps(
        raw_rows(first)
    )


def test_a_history_written_with_a_codec_and_read_without_the_key_fails_clearly(harvest, tag):
    h = make(harvest, codec=FernetCodec({"k1": Fernet.generate_key()}, primary="k1"))
    run_id = h.start_workflow("pii_flow", {"card": SECRET}, execution_id=f"nokey-{tag}")
    h.result(run_id, timeout=30)
    with pytest.raises(PayloadCodecError, match="encoded with codec 'fernet'.*no such codec is configured"):
        make(harvest).history(run_id)
    other = make(harvest, codec=FernetCodec({"k2": Fernet.generate_key()}, primary="k2"))
    with pytest.raises(PayloadCodecError, match="key 'k1'.*does not hold"):
        other.history(run_id)
    # a read-only view degrades instead of failing: the row is still described
    assert make(harvest).describe(run_id).status == "COMPLETED"


def test_a_reference_without_a_configured_store_names_the_blob_and_store(harvest, tag):
    h = make(harvest, payload_store=PostgresPayloadStore(), offload_threshold=1024)
    run_id = h.start_workflow("pii_flow", {"size": 4000}, execution_id=f"nostore-{tag}")
    h.result(run_id, timeout=30)
    # a decision's blobs are under the run's prefix and a part unique to its staging
    with pytest.raises(PayloadStoreError, match=rf"store 'pg' \(blob '{run_id}/[0-9a-f]{{12}}/\d+/output'\)"):
        make(harvest).history(run_id)


def test_cap_rejection_leaves_no_event_and_no_activity_row(harvest, tag):
    h = Harvest(DATABASE_URL, max_activity_input_bytes=64)
    h.register(echo, blob, pii_flow)
    run_id = h.start_workflow("pii_flow", {"card": SECRET, "pad": "p" * 100}, execution_id=f"cap-{tag}")
    with pytest.raises(WorkflowFailed, match="PayloadTooLarge: payload too large: input of activity 'echo'"):
        h.result(run_id, timeout=30)
    assert [e.event.type for e in h.history(run_id)] == ["WorkflowStarted", "WorkflowFailed"]
    assert h.store.activity_rows(run_id) == []


def test_erasure_tombstones_every_payload_field_and_keeps_order(harvest, tag):
    h = make(harvest, payload_store=PostgresPayloadStore(), offload_threshold=1024)
    run_id = h.start_workflow(
        "pii_flow", {"card": SECRET, "size": 4000, "wait": True}, execution_id=f"erase-{tag}"
    )
    for i in range(5):
        h.signal(run_id, "noise", {"card": SECRET, "i": i})
    h.signal(run_id, "confirm", {"card": SECRET})
    h.result(run_id, timeout=30)
    before = raw_rows(run_id)
    counts = h.erase_payloads(run_id)
    after = raw_rows(run_id)
    assert [r["seq"] for r in after] == [r["seq"] for r in before]  # nothing removed or reordered
    assert [r["data"]["type"] for r in after] == [r["data"]["type"] for r in before]
    assert SECRET not in json.dumps(after)
    for r in after:
        for name in ("input", "output", "payload", "result", "details"):
            if r["data"].get(name) is not None:
                assert r["data"][name] == {"_harvest_erased": True}, r
    row = h.describe(run_id)
    assert row.input == {"_harvest_erased": True} and row.result == {"_harvest_erased": True}
    assert row.status == "COMPLETED"  # still readable: names, statuses, timings
    assert counts["blobs"] == 1 and counts["events"] >= 10
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(sa.func.count()).select_from(blobs).where(blobs.c.key.like(f"{run_id}/%"))
            ).scalar_one()
            == 0
        )
    engine.dispose()
    assert h.erase_payloads(run_id)["fields"] == 0  # idempotent


def test_erasure_of_a_live_run_is_refused_and_writes_nothing(harvest, tag):
    h = make(harvest)
    run_id = h.start_workflow("pii_flow", {"card": SECRET, "wait": True}, execution_id=f"live-{tag}")
    before = raw_rows(run_id)
    with pytest.raises(Exception, match="cannot erase the payloads of execution .* it is RUNNING"):
        h.erase_payloads(run_id)
    assert raw_rows(run_id) == before


def test_erasure_racing_a_reader_holding_the_row_lock_is_serialised(harvest, tag):
    h = make(harvest)
    run_id = h.start_workflow("pii_flow", {"card": SECRET}, execution_id=f"race-{tag}")
    h.result(run_id, timeout=30)
    order: list[str] = []
    locked = threading.Event()

    def reader() -> None:
        with h.store.begin() as tx:
            tx.lock(run_id)  # what a forker takes before copying events
            locked.set()
            time.sleep(1.0)
            history = tx.history(run_id)
            order.append(
                "reader saw " + ("intact" if history[0].event.input.get("card") == SECRET else "erased")
            )

    t = threading.Thread(target=reader)
    t.start()
    locked.wait(5)
    h.erase_payloads(run_id)
    order.append("erased")
    t.join()
    assert order == ["reader saw intact", "erased"]


def test_purge_deletes_old_terminal_runs_in_batches_and_never_a_live_one(harvest, tag):
    h = make(harvest)
    done = [h.start_workflow("pii_flow", {"i": i}, execution_id=f"purge-{tag}-{i}") for i in range(3)]
    for run_id in done:
        h.result(run_id, timeout=30)
    live = h.start_workflow("pii_flow", {"wait": True}, execution_id=f"purge-live-{tag}")
    engine = sa.create_engine(DATABASE_URL)
    with engine.begin() as conn:  # age them
        conn.execute(
            executions.update()
            .where(executions.c.id.in_(done + [live]))
            .values(closed_at=sa.func.now() - sa.text("interval '40 days'"))
        )
    report = h.purge(older_than_days=30, batch=2)
    assert report["runs"] >= 3 and report["events"] >= 3 * 8
    with engine.connect() as conn:
        left = (
            conn.execute(sa.select(executions.c.id).where(executions.c.id.like(f"purge-%{tag}%")))
            .scalars()
            .all()
        )
        assert left == [live]
        assert (
            conn.execute(
                sa.select(sa.func.count())
                .select_from(activity_tasks)
                .where(activity_tasks.c.execution_id.in_(done))
            ).scalar_one()
            == 0
        )
    engine.dispose()
