"""The activity-input cap and the payload store, against the pure engine and the pipeline.

The spec's sizing note: a registered PayloadStore lets an oversized compensation envelope through
as a reference. The cap applies to what would be stored inline after offload, for forward inputs
and envelopes alike; without a store an over-cap input is refused as before. A store added or
removed in the middle of an unwind is pinned here (docs/payloads.md, "Changing the store
mid-unwind").
"""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from harvest_celery import FernetCodec, PayloadTooLarge, activity, dag, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.engine import EngineConfig
from harvest_celery._dag.model import DAG_FAILED
from harvest_celery._errors import PayloadStoreError
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._payloads.stores import is_reference
from harvest_celery.testing import Simulator

CAP = 200


class MemoryStore:
    store_id = "mem"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.blobs[key] = data

    def get(self, key: str) -> bytes:
        return self.blobs[key]

    def delete(self, key: str) -> None:
        self.blobs.pop(key, None)


def offloading(threshold: int = 100, codec=None) -> Payloads:
    return Payloads(codec, MemoryStore(), threshold)


WITH_STORE = EngineConfig(max_activity_input_bytes=CAP, offloads=offloading().offloads)
NO_STORE = EngineConfig(max_activity_input_bytes=CAP)


# ── the pipeline's answer mirrors what it writes ──────────────────────────────────────────────
@pytest.mark.parametrize(
    "value,offloaded",
    [("s" * 150, True), ("s" * 50, False), (None, False), ({"_harvest_erased": True}, False)],
)
def test_offloads_answers_what_encode_value_does(value, offloaded):
    payloads = offloading(threshold=100)
    assert payloads.offloads(value) is offloaded
    assert is_reference(payloads.encode_value(value, "run/1/input")) is offloaded
    assert payloads.store.blobs == ({"run/1/input": b'"' + b"s" * 150 + b'"'} if offloaded else {})


def test_offloads_measures_the_codec_encoded_value():
    codec = FernetCodec({"k": Fernet.generate_key()}, primary="k")
    payloads = offloading(threshold=150, codec=codec)
    value = "s" * 60  # 62 bytes plain, well over 150 once encrypted
    assert payloads.offloads(value) and is_reference(payloads.encode_value(value, "run/1/input"))
    assert not Payloads(codec).offloads(value)  # no store: nothing is ever offloaded


# ── forward inputs ────────────────────────────────────────────────────────────────────────────
@activity
def upload(blob):
    return len(blob)


@activity
def store_cells(blob):
    return blob


@workflow
async def uploads(ctx, blob):
    try:
        return await ctx.execute_activity(upload, blob)
    except PayloadTooLarge as exc:
        return f"refused: {exc}"


@workflow
async def checks_cells(ctx, blobs):
    try:
        ctx.check_activity_inputs(store_cells, blobs)
    except PayloadTooLarge as exc:
        return f"refused: {exc}"
    return "fits"


def test_an_over_cap_forward_input_a_store_takes_is_dispatched_whole():
    run = Simulator(uploads, upload, config=WITH_STORE).start("uploads", "x" * 500).run_to_end()
    assert [(e.activity_name, e.input) for e in run.scheduled()] == [("upload", "x" * 500)]
    assert run.status == "COMPLETED" and run.events[-1].result == 500


def test_without_a_store_an_over_cap_forward_input_is_refused_as_before():
    run = Simulator(uploads, upload, config=NO_STORE).start("uploads", "x" * 500).run_to_end()
    assert run.scheduled() == []
    assert run.events[-1].result == (
        f"refused: payload too large: input of activity 'upload' is 502 bytes, over the cap of {CAP} bytes"
    )


def test_an_over_cap_input_a_store_keeps_inline_is_still_refused():
    # the offload threshold is above the cap: the 502-byte input would stay inline, over the cap
    config = EngineConfig(max_activity_input_bytes=CAP, offloads=offloading(threshold=1000).offloads)
    run = Simulator(uploads, upload, config=config).start("uploads", "x" * 500).run_to_end()
    assert run.scheduled() == [] and run.events[-1].result.startswith("refused: payload too large")


@pytest.mark.parametrize("config,result", [(WITH_STORE, "fits"), (NO_STORE, "refused")])
def test_mapped_cells_are_checked_after_offload_too(config, result):
    run = Simulator(checks_cells, store_cells, config=config).start("checks_cells", ["x" * 500, "y"])
    run.run_to_end()
    assert run.events[-1].result.startswith(result)


# ── compensation envelopes ────────────────────────────────────────────────────────────────────
def _act(name, output):
    return activity(name=name)(lambda _x: output)


na, nbig, nfail = _act("na", "A"), _act("nbig", "x" * 500), _act("nfail", None)
undo, undo_big = _act("undo", "undone"), _act("undo_big", "undone big")


@dag
def separate(g):
    """nbig's envelope (its 500-byte output) is over the cap; na's is not. The unwind pops
    nbig's compensation (undo_big) first, then na's (undo)."""
    a = g.activity(na).compensate(undo)
    big = g.activity(nbig).upstream(a).compensate(undo_big)
    g.activity(nfail).upstream(big)


@dag
def shared(g):
    """As ``separate``, with one compensator shared by both nodes."""
    a = g.activity(na).compensate(undo)
    big = g.activity(nbig).upstream(a).compensate(undo)
    g.activity(nfail).upstream(big)


def sim(config):
    s = Simulator(separate, shared, na, nbig, nfail, undo, undo_big, config=config)
    s.behaviour["nfail"] = lambda _x: (_ for _ in ()).throw(RuntimeError("nfail down"))
    return s


def comps(run):
    return [(e.activity_name, e.input["dag_compensate"]) for e in run.scheduled() if e.compensation]


def to_first_compensation(run):
    """Forward to nfail's failure, then the unwind's first decision."""
    for _ in range(3):
        run.decide()
        for activity_ in run.open_activities():
            run.execute(activity_)
    return run.decide()


def test_an_over_cap_envelope_a_store_takes_is_dispatched_and_the_unwind_is_clean():
    run = sim(WITH_STORE).start("separate", {}).run_to_end()
    assert comps(run) == [("undo_big", "nbig"), ("undo", "na")]
    envelope = next(e.input for e in run.scheduled() if e.activity_name == "undo_big")
    assert envelope["output"] == "x" * 500  # the whole value: offloading is the pipeline's job
    assert run.status == "FAILED" and run.events[-1].error_type != "SagaCompensationFailed"
    assert run.events[-1].message == DAG_FAILED


def test_without_a_store_an_over_cap_envelope_is_refused_as_before():
    run = sim(NO_STORE).start("separate", {}).run_to_end()
    assert comps(run) == [("undo", "na")]  # continue-not-abort: na is still undone
    assert run.events[-1].error_type == "SagaCompensationFailed"
    assert "input of activity 'undo_big' is" in run.events[-1].message


# ── a store added or removed in the middle of an unwind ───────────────────────────────────────
def test_known_limitation_adding_a_store_mid_unwind_diverges():
    s = sim(NO_STORE)
    run = s.start("separate", {})
    to_first_compensation(run)
    assert comps(run) == [("undo", "na")] and run.status == "RUNNING"  # undo_big was refused
    length = len(run.history)
    s.config = WITH_STORE  # a store is added while undo runs
    run.decide()
    assert run.nd is not None and run.status == "RUNNING" and len(run.history) == length
    assert run.nd["expected"] == "ActivityScheduled(undo_big)"
    assert run.nd["actual"] == "ActivityScheduled(undo)"
    s.config = NO_STORE  # removed again: the run recovers and ends as it would have
    run.run_to_end()
    assert run.nd is None and comps(run) == [("undo", "na")]
    assert run.events[-1].error_type == "SagaCompensationFailed"


def test_known_limitation_adding_a_store_mid_unwind_with_a_shared_compensator_misattributes():
    s = sim(NO_STORE)
    run = s.start("shared", {})
    to_first_compensation(run)
    assert comps(run) == [("undo", "na")]  # nbig's envelope was refused
    s.config = WITH_STORE
    run.run_to_end()
    # The matcher is name-keyed: nbig's now-accepted compensation takes na's recorded dispatch,
    # and na's is dispatched again. No divergence; nbig is never undone, na is undone twice, and
    # the unwind reads as clean.
    assert run.nd is None
    assert comps(run) == [("undo", "na"), ("undo", "na")]
    assert run.events[-1].message == DAG_FAILED


def test_a_store_added_before_a_refusal_is_decided_just_takes_effect():
    s = sim(NO_STORE)
    run = s.start("separate", {})
    for _ in range(2):  # na and nbig succeed; nfail is dispatched, not yet failed
        run.decide()
        for activity_ in run.open_activities():
            run.execute(activity_)
    run.decide()
    s.config = WITH_STORE
    run.run_to_end()
    assert run.nd is None and comps(run) == [("undo_big", "nbig"), ("undo", "na")]
    assert run.events[-1].message == DAG_FAILED


def test_removing_the_store_mid_unwind_never_rechecks_a_recorded_dispatch():
    s = sim(WITH_STORE)
    run = s.start("separate", {})
    to_first_compensation(run)
    assert comps(run) == [("undo_big", "nbig")]  # accepted: the store takes the envelope
    s.config = NO_STORE  # the engine's side: the recorded dispatch is matched, never re-capped
    run.run_to_end()
    assert run.nd is None and comps(run) == [("undo_big", "nbig"), ("undo", "na")]
    assert run.events[-1].message == DAG_FAILED


def test_removing_the_store_leaves_its_references_unreadable():
    # The runtime's side: the offloaded envelope is a reference in history, and a decision reads
    # history strictly, so without the store the run's decisions fail until it is restored.
    payloads = offloading()
    scheduled = ev.ActivityScheduled("4", "undo_big", {"output": "x" * 500}, "default", True)
    stored = payloads.encode_event({"type": "ActivityScheduled", **vars(scheduled)}, "run-1/9")
    assert is_reference(stored["input"])
    with pytest.raises(PayloadStoreError, match="no payload store is configured") as raised:
        Payloads().decode_event(stored)
    assert raised.value.key == "run-1/9/input" and raised.value.store_id == "mem"
