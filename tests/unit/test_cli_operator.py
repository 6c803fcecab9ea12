"""The operator commands of the ``harvest`` CLI (terminate, pause, resume, reset, retry, erase,
purge), run in-process against an embedded SQLite app (tests/unit/cli_operator_app.py)."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest
import sqlalchemy as sa

from harvest_celery._cli import main
from harvest_celery._store.schema import executions
from harvest_celery._store.store import Store, utcnow

APP = "tests.unit.cli_operator_app"


@pytest.fixture
def db(cli_db):
    """A migrated SQLite database, and the CLI app freshly pointed at it."""
    return cli_db(APP)


@pytest.fixture
def app(db, capsys):
    """The app module (the CLI imports the same one), its output so far discarded."""
    assert main(["--app", APP, "list"]) == 0  # imports the app module once
    capsys.readouterr()
    return sys.modules[APP]


def cli(capsys, *argv):
    code = main(["--app", APP, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(url):
    return {
        x.id: (x.status, x.history_length, x.paused_at, x.erased_at, x.forked_to)
        for x in Store(url).list(limit=100_000)
    }


def names(store, run_id):
    return [h.describe() for h in store.history(run_id)]


# ── terminate ────────────────────────────────────────────────────────────────────────────────
def test_terminate_seals_a_live_run(app, db, capsys):
    run_id = app.harvest.start_workflow("op_gate", "x", execution_id="t-1")
    code, out, err = cli(capsys, "terminate", run_id, "--reason", "stuck")
    assert (code, out.strip(), err) == (0, "t-1 TERMINATED", "")
    row = app.harvest.describe(run_id)
    assert row.status == "TERMINATED" and row.error == {"type": "Terminated", "message": "stuck"}
    assert names(app.harvest.store, run_id)[-1] == "WorkflowFailed"
    before = snapshot(db)
    code, _out, err = cli(capsys, "terminate", run_id)
    assert code == 2 and err.startswith("harvest: error: cannot terminate execution 't-1'")
    assert snapshot(db) == before


def test_terminate_an_unknown_run_exits_2(app, capsys):
    code, _out, err = cli(capsys, "terminate", "missing")
    assert (code, err.strip()) == (2, "harvest: error: no execution with id 'missing'")


# ── pause / resume ───────────────────────────────────────────────────────────────────────────
def test_pause_holds_decisions_until_resume(app, db, capsys):
    run_id = app.harvest.start_workflow("op_gate", "x", execution_id="p-1")
    code, out, _ = cli(capsys, "pause", run_id)
    assert (code, out.strip()) == (0, "paused p-1")
    paused_at = app.harvest.describe(run_id).paused_at
    assert paused_at is not None
    app.harvest.signal(run_id, "go", "yes")
    assert app.harvest.describe(run_id).status == "RUNNING"  # the signal is recorded, not decided on
    assert names(app.harvest.store, run_id)[-1] == "SignalReceived(go)"
    code, out, _ = cli(capsys, "pause", run_id)  # pausing again keeps the first pause
    assert code == 0 and app.harvest.describe(run_id).paused_at == paused_at
    code, out, _ = cli(capsys, "resume", run_id)
    assert (code, out.strip()) == (0, "resumed p-1")
    row = app.harvest.describe(run_id)
    assert (row.status, row.result, row.paused_at) == ("COMPLETED", "x:yes", None)


def test_resume_of_a_run_that_is_not_paused_and_pause_of_a_finished_run_exit_2(app, db, capsys):
    run_id = app.harvest.start_workflow("op_gate", "x", execution_id="p-2")
    before = snapshot(db)
    code, _out, err = cli(capsys, "resume", run_id)
    assert code == 2 and "cannot resume execution 'p-2': it is not paused" in err
    assert snapshot(db) == before
    app.harvest.terminate(run_id)
    before = snapshot(db)
    code, _out, err = cli(capsys, "pause", run_id)
    assert code == 2 and "cannot pause execution 'p-2': it is TERMINATED" in err
    assert snapshot(db) == before


# ── reset ────────────────────────────────────────────────────────────────────────────────────
def test_reset_forks_a_run_and_prints_the_new_id(app, db, capsys):
    run_id = app.harvest.start_workflow("op_gate", "x", execution_id="r-1")
    code, out, _ = cli(capsys, "reset", run_id, "--to-seq", "4", "--new-id", "r-1b")
    assert (code, out.strip()) == (0, "r-1b")
    assert app.harvest.describe(run_id).status == "TERMINATED"  # a live source is terminated
    assert app.harvest.describe(run_id).forked_to == "r-1b"
    new = app.harvest.describe("r-1b")
    assert (new.forked_from, new.status) == ("r-1", "RUNNING")
    app.harvest.signal("r-1b", "go", "again")
    assert app.harvest.result("r-1b", timeout=5) == "x:again"
    assert app.RAN.count("op_echo") == 1  # the copied prefix is not re-run


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--to-seq", "0"], "--to-seq must be at least 1"),
        (["--to-seq", "-3"], "--to-seq must be at least 1"),
        (["--to-seq", "99"], "reset point must be between 1 and"),
        (["--to-seq", "2", "--new-id", "x" * 201], "an id has at most 200 characters"),
        (["--to-seq", "2", "--new-id", "taken"], "already exists"),
    ],
)
def test_a_refused_reset_exits_2_and_writes_nothing(app, db, capsys, argv, message):
    app.harvest.start_workflow("op_gate", "y", execution_id="taken")
    run_id = app.harvest.start_workflow("op_gate", "x", execution_id="r-2")
    before = snapshot(db)
    code, _out, err = cli(capsys, "reset", run_id, *argv)
    assert code == 2 and err.startswith("harvest: error: ") and message in err, err
    assert snapshot(db) == before


def test_reset_needs_to_seq(app, capsys):
    code, _out, err = cli(capsys, "reset", "r-3")
    assert code == 2 and "--to-seq" in err


def test_reset_of_an_erased_run_exits_2(app, db, capsys):
    run_id = app.harvest.start_workflow("op_gate", "x", execution_id="r-4")
    app.harvest.signal(run_id, "go", "yes")
    app.harvest.erase_payloads(run_id)
    before = snapshot(db)
    code, _out, err = cli(capsys, "reset", run_id, "--to-seq", "2")
    assert code == 2 and "were erased" in err
    assert snapshot(db) == before


# ── retry ────────────────────────────────────────────────────────────────────────────────────
def test_retry_dry_run_prints_the_plan_and_forks_nothing(app, db, capsys):
    source = app.harvest.start_workflow("op_retryable", {"k": 1}, execution_id="d-1")
    assert app.harvest.describe(source).status == "FAILED"
    before = snapshot(db)
    code, out, err = cli(capsys, "retry", "op_retryable", source, "--dry-run")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "retry of d-1 from node op_flaky",
        "  carried: op_first",
        "  rerun:   op_flaky, op_last",
        "dry run: no run started",
    ]
    assert snapshot(db) == before


def test_retry_starts_a_run_that_carries_the_upstream(app, db, capsys):
    source = app.harvest.start_workflow("op_retryable", {"k": 1}, execution_id="d-2")
    code, out, _ = cli(capsys, "retry", "op_retryable", source, "--new-id", "d-2b")
    assert code == 0 and out.splitlines()[-1] == "d-2b"
    out = app.harvest.result("d-2b", timeout=5)
    assert out["op_last"] == "done" and out["op_flaky"]["saw"] == {"node": "op_first"}
    assert app.RAN == ["op_first", "op_flaky", "op_flaky", "op_last"]  # op_first carried
    assert app.harvest.describe(source).forked_to == "d-2b"
    # from an explicit node: everything re-runs from op_first
    code, out, _ = cli(capsys, "retry", "op_retryable", source, "--from-node", "op_first", "--dry-run")
    assert code == 0 and "  carried: (none)" in out and "op_first, op_flaky, op_last" in out


@pytest.mark.parametrize(
    "case, message",
    [
        ("compensated", "already executed its compensation unwind"),
        ("completed", "completed: nothing to retry"),
        ("running", "is still running"),
        ("erased", "were erased"),
        ("unknown_node", "dag 'op_retryable' has no node 'nope'"),
        ("unknown_dag", "unknown workflow 'no_such_dag'"),
        ("not_a_dag", "unknown workflow 'op_gate'"),
        ("unknown_run", "no execution with id 'missing'"),
    ],
)
def test_a_refused_retry_exits_2_and_writes_nothing(app, db, capsys, case, message):
    h = app.harvest
    dag, argv = "op_retryable", []
    if case == "compensated":
        dag, run_id = "op_compensating", h.start_workflow("op_compensating", {})
    elif case == "completed":
        source = h.start_workflow("op_retryable", {})
        run_id = h.retry_dag_run("op_retryable", source)["run_id"]
        assert h.describe(run_id).status == "COMPLETED"
    elif case == "running":  # a failed run reopened as if a node were still running
        run_id = h.start_workflow("op_retryable", {})
        with h.store.engine.begin() as conn:
            conn.execute(
                executions.update().where(executions.c.id == run_id).values(status="RUNNING", closed_at=None)
            )
    elif case == "erased":
        run_id = h.start_workflow("op_retryable", {})
        h.erase_payloads(run_id)
    else:
        run_id = h.start_workflow("op_retryable", {})
        if case == "unknown_node":
            argv = ["--from-node", "nope"]
        elif case == "unknown_dag":
            dag = "no_such_dag"
        elif case == "not_a_dag":
            dag = "op_gate"
        else:
            run_id = "missing"
    before = snapshot(db)
    code, _out, err = cli(capsys, "retry", dag, run_id, *argv)
    assert code == 2, err
    assert err.startswith("harvest: error: ") and message in err, err
    assert snapshot(db) == before


# ── erase ────────────────────────────────────────────────────────────────────────────────────
def test_erase_tombstones_a_terminal_run_and_is_idempotent(app, db, capsys):
    run_id = app.harvest.start_workflow("op_gate", {"secret": "pan-4111"}, execution_id="e-1")
    app.harvest.signal(run_id, "go", "yes")
    code, out, _ = cli(capsys, "erase", run_id)
    assert code == 0 and out.startswith("erased e-1: ") and "0 blobs deleted" in out
    row = app.harvest.describe(run_id)
    assert row.erased_at is not None and row.status == "COMPLETED"
    assert "pan-4111" not in repr([h.event for h in app.harvest.history(run_id, strict=False)])
    code, out, _ = cli(capsys, "erase", run_id)
    assert (code, out.strip()) == (0, "erased e-1: 0 payload fields in 0 events, 0 blobs deleted")


def test_erase_of_a_live_run_exits_2(app, db, capsys):
    run_id = app.harvest.start_workflow("op_gate", "x", execution_id="e-2")
    before = snapshot(db)
    code, _out, err = cli(capsys, "erase", run_id)
    assert code == 2 and "cannot erase the payloads of execution 'e-2': it is RUNNING" in err
    assert snapshot(db) == before


# ── purge ────────────────────────────────────────────────────────────────────────────────────
def test_purge_deletes_old_terminal_runs_only(app, db, capsys):
    old = app.harvest.start_workflow("op_retryable", {}, execution_id="old")
    recent = app.harvest.start_workflow("op_compensating", {}, execution_id="recent")
    live = app.harvest.start_workflow("op_gate", "x", execution_id="live-old")
    with app.harvest.store.engine.begin() as conn:
        long_ago = utcnow() - timedelta(days=40)
        conn.execute(
            executions.update()
            .where(executions.c.id.in_([old, live]))
            .values(closed_at=long_ago, created_at=long_ago)
        )
    events = app.harvest.describe(old).history_length
    code, out, _ = cli(capsys, "purge", "--older-than", "30", "--batch", "1")
    assert code == 0
    assert out.strip() == f"purged 1 runs closed more than 30 days ago: {events} events, 0 blobs"
    assert set(snapshot(db)) == {recent, live}
    with app.harvest.store.engine.connect() as conn:
        from harvest_celery._store.schema import events as events_table

        left = conn.execute(
            sa.select(sa.func.count()).select_from(events_table).where(events_table.c.execution_id == old)
        ).scalar_one()
    assert left == 0
    code, out, _ = cli(capsys, "purge", "--older-than", "30")
    assert out.strip() == "purged 0 runs closed more than 30 days ago: 0 events, 0 blobs"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--older-than", "-1"], "--older-than must be a number of days"),
        (["--older-than", "nan"], "--older-than must be a number of days"),
        (["--older-than", "inf"], "--older-than must be a number of days"),
        (["--older-than", "1", "--batch", "0"], "--batch must be at least 1"),
        (["--older-than", "soon"], "invalid float value"),
        ([], "--older-than"),
    ],
)
def test_a_malformed_purge_exits_2_and_deletes_nothing(app, db, capsys, argv, message):
    app.harvest.start_workflow("op_retryable", {})
    before = snapshot(db)
    code, _out, err = cli(capsys, "purge", *argv)
    assert code == 2 and message in err, err
    assert snapshot(db) == before


def test_operator_commands_need_an_app(db, capsys):
    for argv in (
        ["terminate", "x"],
        ["pause", "x"],
        ["resume", "x"],
        ["reset", "x", "--to-seq", "1"],
        ["retry", "d", "x"],
        ["erase", "x"],
        ["purge", "--older-than", "1"],
    ):
        assert main(["--database-url", db, *argv]) == 2
        assert "needs --app" in capsys.readouterr().err
