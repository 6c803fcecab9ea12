"""``harvest replay`` / ``WorkflowReplayer`` (issue 14): replay stored histories against the current
code — in embedded mode (SQLite), no services. The app module (tests/unit/cli_replay_app.py)
holds three builds of the same workflow names: the one that recorded the histories, one with two
steps swapped, one with a step added at the end."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import stat
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest_celery import FernetCodec, Harvest
from harvest_celery._cli import main
from harvest_celery._core.engine import replay_history
from harvest_celery._core.registry import Registry, register_into
from harvest_celery._runtime.metrics import METRICS
from harvest_celery.replay import RecordedRun, ReplayReport, WorkflowReplayer, export_run
from tests.unit import test_engine_properties as P

APP = "tests.unit.cli_replay_app"


@pytest.fixture
def db(cli_db) -> str:
    return cli_db(APP)


@pytest.fixture
def app(db, capsys) -> Any:
    assert main(["--app", APP, "list"]) == 0  # imports the app module once, against db
    capsys.readouterr()
    return sys.modules[APP]


def cli(capsys, *argv: str, build: str = "harvest") -> tuple[int, str, str]:
    code = main(["--app", f"{APP}:{build}", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def record(app: Any) -> dict[str, str]:
    """Histories recorded by the first build: two completed runs, one open run waiting for a
    signal, one cancelled run whose durable compensations diverged against the cancel."""
    h = app.harvest
    runs = {
        "done-1": h.start_workflow("rp_order", {"n": 1}, execution_id="done-1"),
        "done-2": h.start_workflow("rp_order", {"n": 2}, execution_id="done-2"),
        "open": h.start_workflow("rp_order", {"wait": True}, execution_id="open"),
        "cancelled": h.start_workflow("rp_cancel", {}, execution_id="cancelled"),
    }
    h.cancel_workflow_execution("cancelled", reason="ops")
    assert [h.describe(r).status for r in runs] == ["COMPLETED", "COMPLETED", "RUNNING", "CANCELLED"]
    return runs


def test_an_unchanged_workflow_replays_ok_and_strict_exits_zero(app, capsys):
    record(app)
    report = WorkflowReplayer(app.harvest).replay_database()
    assert isinstance(report, ReplayReport) and report.passed
    assert sorted((r.execution_id, r.result) for r in report.runs) == [
        ("cancelled", "ok"),
        ("done-1", "ok"),
        ("done-2", "ok"),
        ("open", "ok"),
    ]
    code, out, err = cli(capsys, "replay", "--strict")
    assert code == 0 and err == ""
    assert "replayed 4 runs: 4 ok, 0 diverged, 0 errors, 0 skipped" in out


def test_the_pinned_cancel_divergence_is_not_drift(app):
    record(app)
    failed = [h.describe() for h in app.harvest.history("cancelled")][-1]
    assert failed == "WorkflowFailed"  # SagaCompensationFailed: "... got WorkflowCancelled"
    assert "got WorkflowCancelled" in app.harvest.describe("cancelled").error["message"]
    history = app.harvest.history("cancelled")
    probe = replay_history(
        app.harvest.registry.workflow("rp_cancel"), "cancelled", history, app.harvest.registry
    )
    assert probe.nd is None and probe.commands == []  # a sealed run records no divergence
    [verdict] = WorkflowReplayer(app.harvest).replay_database(ids=["cancelled"]).runs
    assert verdict.result == "ok", verdict.line()


def test_a_reordered_workflow_fails_strict_and_is_only_reported_in_canary(app, capsys):
    record(app)
    report = WorkflowReplayer(app.swapped).replay_database(workflow="rp_order")
    assert not report.passed and {r.execution_id for r in report.diverged} == {"done-1", "done-2", "open"}
    verdict = report.diverged[0]
    assert (verdict.expected, verdict.actual, verdict.event_index) == (
        "ActivityScheduled(rp_b)",
        "ActivityScheduled(rp_a)",
        1,
    )
    code, out, _ = cli(capsys, "replay", "--strict", "--workflow", "rp_order", build="swapped")
    assert code == 1
    assert (
        "DIVERGED done-1 (rp_order, 11 events): expected ActivityScheduled(rp_b), got "
        "ActivityScheduled(rp_a) at event 1" in out
    )
    assert "0 ok, 3 diverged" in out and "strict: failing" in out
    code, out, _ = cli(capsys, "replay", "--canary", "--workflow", "rp_order", build="swapped")
    assert code == 0 and "3 diverged" in out and "canary: reported only" in out


def test_drift_before_a_cancel_is_still_caught(app):
    """A sealed run never records nd; its pre-cancel prefix is checked as an open run."""
    record(app)
    [verdict] = WorkflowReplayer(app.swapped).replay_database(ids=["cancelled"]).runs
    assert verdict.result == "diverged" and verdict.event_index == 1
    assert (verdict.expected, verdict.actual) == ("ActivityScheduled(rp_b)", "ActivityScheduled(rp_a)")


def test_new_commands_at_the_frontier_of_an_open_run_are_not_drift(app):
    record(app)
    app.harvest.pause("open")
    app.harvest.signal("open", "go")  # recorded, not yet decided: the next decision dispatches rp_c
    assert [h.describe() for h in app.harvest.history("open")][-1] == "SignalReceived(go)"
    for build in (app.harvest, app.longer):
        [verdict] = WorkflowReplayer(build).replay_database(ids=["open"]).runs
        assert verdict.result == "ok", verdict.line()


def test_a_new_command_after_a_closed_run_is_drift(app):
    record(app)
    report = WorkflowReplayer(app.longer).replay_database(workflow="rp_order", status="COMPLETED")
    assert {r.execution_id for r in report.diverged} == {"done-1", "done-2"}
    verdict = report.diverged[0]
    assert (verdict.expected, verdict.actual) == ("ActivityScheduled(rp_d)", "WorkflowCompleted")


def test_export_then_replay_from_the_file_round_trips(app, db, capsys, tmp_path):
    record(app)
    out = tmp_path / "done-1.json"
    code, _, err = cli(capsys, "export", "done-1", "--out", str(out))
    assert code == 0 and "it holds the run's payloads decoded" in err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    document = json.loads(out.read_text())
    assert (document["execution_id"], document["workflow_type"], document["status"]) == (
        "done-1",
        "rp_order",
        "COMPLETED",
    )
    first = document["events"][0]
    assert set(first) == {"seq", "type", "data", "recorded_at"}
    assert first["type"] == "WorkflowStarted" and first["data"]["input"] == {"n": 1}
    assert [e["seq"] for e in document["events"]] == list(range(len(document["events"])))
    code, stdout, _ = cli(capsys, "export", "done-1")
    assert code == 0 and json.loads(stdout)["events"] == document["events"]
    assert main(["--database-url", db, "export", "done-1"]) == 0  # no --app needed
    assert json.loads(capsys.readouterr().out)["events"] == document["events"]

    code, text, _ = cli(capsys, "replay", "--strict", "--file", str(out))
    assert code == 0 and f"OK       done-1 (rp_order, 11 events) [{out}]" in text
    code, text, _ = cli(capsys, "replay", "--strict", "--file", str(out), build="swapped")
    assert code == 1 and "expected ActivityScheduled(rp_b), got ActivityScheduled(rp_a)" in text
    from_db = WorkflowReplayer(app.swapped).replay_database(ids=["done-1"]).runs[0]
    from_file = WorkflowReplayer(app.swapped.registry).replay_files([out]).runs[0]
    assert (from_db.expected, from_db.actual, from_db.event_index) == (
        from_file.expected,
        from_file.actual,
        from_file.event_index,
    )


def test_an_export_holds_payloads_decoded_and_a_wrong_key_is_an_error_verdict(app, db, tmp_path):
    from cryptography.fernet import Fernet

    key = Fernet.generate_key()
    url = f"sqlite:///{tmp_path / 'enc.db'}"
    sealed = Harvest(url, codec=FernetCodec({"k1": key}, "k1")).register(*app.ACTIVITIES, app.order_v1)
    sealed.migrate()
    sealed.start_workflow("rp_order", {"card": "4242"}, execution_id="enc-1")
    with sqlite3.connect(tmp_path / "enc.db") as conn:
        stored = " ".join(str(row[0]) for row in conn.execute("SELECT data FROM harvest_events"))
    assert "4242" not in stored  # encrypted at rest
    document = export_run(sealed.store, "enc-1")
    assert document["events"][0]["data"]["input"] == {"card": "4242"}  # decoded in the export
    assert WorkflowReplayer(sealed).replay_database().passed
    wrong = Harvest(url, codec=FernetCodec({"k1": Fernet.generate_key()}, "k1")).register(
        *app.ACTIVITIES, app.order_v1
    )
    [verdict] = WorkflowReplayer(wrong).replay_database().runs
    assert verdict.result == "error" and "PayloadCodecError" in str(verdict.reason)


def test_unreadable_exports_are_errors_not_crashes(app, capsys, tmp_path):
    record(app)
    good = WorkflowReplayer(app.harvest).export("done-1")
    unknown = json.loads(json.dumps(good))
    unknown["events"][3]["type"] = unknown["events"][3]["data"]["type"] = "ActivityTeleported"
    gap = json.loads(json.dumps(good))
    del gap["events"][2]
    files = {
        "unknown.json": json.dumps(unknown),
        "gap.json": json.dumps(gap),
        "broken.json": "{not json",
        "list.json": json.dumps([good, {"format": "other"}]),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    report = WorkflowReplayer(app.harvest.registry).replay_files(sorted(tmp_path.glob("*.json")))
    reasons = {r.source.rsplit("/", 1)[-1] + ":" + r.execution_id: (r.result, r.reason) for r in report.runs}
    assert reasons["unknown.json:done-1"][0] == "error"
    assert "UnknownEventType" in str(reasons["unknown.json:done-1"][1])
    assert "seq" in str(reasons["gap.json:done-1"][1])
    assert "cannot read the file" in str(reasons["broken.json:broken.json"][1])
    assert reasons["list.json:done-1"] == ("ok", None)
    assert "not a harvest export" in str(reasons["list.json:list.json#1"][1])
    code, out, _ = cli(capsys, "replay", "--canary", "--file", *map(str, sorted(tmp_path.glob("*.json"))))
    assert code == 0 and "1 ok, 0 diverged, 4 errors" in out


def test_erased_runs_are_skipped_and_retired_workflows_judged_by_whether_runs_are_open(app):
    record(app)
    app.harvest.erase_payloads("done-2")
    only_cancel = Registry()
    register_into(only_cancel, [app.cancel_v1, *app.ACTIVITIES])
    report = WorkflowReplayer(only_cancel, store=app.harvest.store).replay_database()
    verdicts = {r.execution_id: (r.result, r.reason) for r in report.runs}
    assert verdicts["done-2"] == ("skipped", "payloads erased: nothing meaningful to replay")
    assert verdicts["done-1"] == ("skipped", "a closed run of a workflow no longer registered")
    assert verdicts["open"][0] == "error" and "not registered" in str(verdicts["open"][1])
    assert verdicts["cancelled"] == ("ok", None)
    assert report.exit_code(strict=True) == 1 and report.exit_code(strict=False) == 0


def _database(path: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


def _counters() -> dict[Any, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for counter in METRICS.counters.values()
        for metric in counter.collect()
        for s in metric.samples
    }


def test_a_replay_writes_nothing(app, db, capsys, tmp_path):
    record(app)
    app.harvest.pause("open")
    app.harvest.signal("open", "go")
    path = db.removeprefix("sqlite:///")
    before, counters = _database(path), _counters()
    markers = sum(
        h.describe().startswith("MarkerRecorded")
        for r in ("done-1", "cancelled", "open")
        for h in app.harvest.history(r)
    )
    assert markers == 2  # the cancelled run's saga_compensated:1 and saga_compensation_failed:1
    for build in ("harvest", "swapped", "longer"):
        cli(capsys, "replay", "--canary", build=build)
        WorkflowReplayer(getattr(app, build)).replay_database(limit=1000)
    cli(capsys, "export", "cancelled", "--out", str(tmp_path / "c.json"))
    cli(capsys, "replay", "--file", str(tmp_path / "c.json"))
    assert _database(path) == before
    assert _counters() == counters


@settings(deadline=None, max_examples=60, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_histories_replay_ok_and_a_visible_reorder_is_always_reported(data):
    """On the property tests' random histories (tests/unit/test_engine_properties.py): every
    recorded run is ok, and a swap or rename a command matcher can see is reported diverged —
    sealed (cancelled) runs included, through their pre-cancel prefix."""
    rec = data.draw(P.recorded_runs())
    replayer = WorkflowReplayer(P.new_sim().registry)
    run = RecordedRun(rec.run.execution_id, P.WF, rec.run.history, rec.run.status, source="memory")
    assert replayer.replay(run).result == "ok", replayer.replay(run).line()
    items = P._data(rec.run.history)
    mutation = data.draw(P.mutations(items))
    corrupted = P.mutate(items, mutation)
    if corrupted is None or not P._matcher_sees(mutation, items):
        return
    verdict = replayer.replay(dataclasses.replace(run, history=P._rebuild(corrupted, rec.run.history)))
    assert verdict.result == "diverged", (mutation, verdict.line())


def test_usage_errors(app, capsys):
    code, _, err = cli(capsys, "replay", "--file", "x.json", "--workflow", "rp_order")
    assert code == 2 and "does not combine" in err
    code, _, err = cli(capsys, "replay", "--limit", "0")
    assert code == 2 and "--limit" in err
    code, _, err = cli(capsys, "replay", "--strict", "--canary")
    assert code == 2
    code, out, _ = cli(capsys, "replay", "--id", "nope")
    assert code == 1 and "ERROR    nope (?, 0 events): no execution with id 'nope'" in out
    code, _, err = cli(capsys, "export", "nope")
    assert code == 2 and err.startswith("harvest: error:")
    assert main(["replay"]) == 2  # no --app: the registry of the current code is needed
