"""kill -9 of worker processes: an activity worker at each phase of an attempt, a decision
worker mid-cycle and mid-unwind. Each run's fault point is a hook in ``tests.faults.app``: the
run hangs there, the test kills the process that holds it and starts it again."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.faults


def test_baseline_without_a_fault(faults):
    t0 = time.monotonic()
    faults.start()
    faults.assert_clean("no fault (baseline)", faults.wait_finished(since=t0))


# activity id 2 is step 2's forward activity: the run has done step 1 and has a compensation
# to run if it fails later
ACTIVITY_PHASES = [
    ("claim@2", "activity worker killed before the claim commits"),
    ("start@2", "activity worker killed between claim and body"),
    ("mid@2", "activity worker killed mid-body (after its effect)"),
    ("done@2", "activity worker killed after the body, before the completion"),
]


@pytest.mark.parametrize(("point", "fault"), ACTIVITY_PHASES, ids=[p for p, _f in ACTIVITY_PHASES])
def test_kill_9_of_an_activity_worker(faults, point, fault):
    runs = faults.start(plan=point)
    hung = faults.wait_hung(runs)
    assert {p for p, _pid in hung.values()} == {point}
    t0 = faults.kill_and_restart(hung)
    faults.assert_clean(fault, faults.wait_finished(since=t0))
    # the killed attempt is in the history: claimed (or not) and timed out, then a retry
    for run in runs:
        started = [
            d["attempt"] for t, d in faults.history(run) if t == "ActivityStarted" and d["activity_id"] == "2"
        ]
        assert started == ([1] if point == "claim@2" else [1, 2]), (run, started)


def test_kill_9_of_the_decision_worker_mid_cycle(faults):
    """The first decision of every run hangs inside its transaction (row locked, nothing
    written) in the decision worker, which is killed: the decision request survives in Postgres
    and the sweeper re-sends it. (The harness's starts take no first decision here: with
    eager_start, the starting process would hang instead.)"""
    settings = faults.harvest.runtime.settings
    settings.eager_start = False
    try:
        runs = faults.start(plan="decide")
    finally:
        settings.eager_start = True
    hung = faults.wait_hung(runs)
    assert {w.name for w in faults.owners([pid for _p, pid in hung.values()])} == {"decider"}
    t0 = faults.kill_and_restart(hung)
    faults.assert_clean("decision worker killed mid-cycle", faults.wait_finished(since=t0))


def test_kill_9_of_the_deciding_worker_mid_unwind(faults):
    """Every failing run hangs mid-unwind (step 3 compensated, step 2's compensation about to be
    scheduled) in whichever process takes that decision — inline in the activity worker that
    recorded the previous compensation, as a rule — which is killed and restarted."""
    runs = faults.start(plan="unwind@2", plan_on="failing")
    failing = runs[1::2]
    hung = faults.wait_hung(failing)
    t0 = faults.kill_and_restart(hung)
    faults.assert_clean("deciding worker killed mid-unwind", faults.wait_finished(since=t0))
    for run in failing:
        markers = [d["name"] for t, d in faults.history(run) if t == "MarkerRecorded"]
        assert markers.count("saga_compensated:1") == 1, markers
