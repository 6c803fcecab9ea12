"""Erasure and forks: a fork made by reset or a DAG retry holds copies of its source's payloads
(and the source of the fork's), so erasing one run of a fork family is refused while another
still holds them, unless the whole family is erased with it — in one transaction. Run on the
embedded SQLite app of tests/unit/cli_operator_app.py, through the client and the CLI."""

from __future__ import annotations

import sys

import pytest

from harvest_celery import ForksHoldCopies, InvalidState
from harvest_celery._cli import main
from harvest_celery._store.store import Store

APP = "tests.unit.cli_operator_app"
SECRET = "pan-4111-1111"


@pytest.fixture
def db(cli_db):
    return cli_db(APP)


@pytest.fixture
def app(db, capsys):
    assert main(["--app", APP, "list"]) == 0
    capsys.readouterr()
    return sys.modules[APP]


def state(url):
    """Every run's status, erasure and full history (what a refused erasure must leave alone)."""
    store = Store(url)
    return {
        x.id: (x.status, x.erased_at, repr([h.event for h in store.history(x.id)]))
        for x in store.list(limit=1000)
    }


def holds_secret(h, run_id):
    row = h.describe(run_id)
    return SECRET in repr([e.event for e in h.history(run_id, strict=False)]) + repr(row.input)


def reset_family(h):
    """``src`` (completed), ``src-b`` reset from it (completed), ``src-c`` reset from that."""
    h.start_workflow("op_gate", {"card": SECRET}, execution_id="src")
    h.signal("src", "go", "yes")
    h.reset("src", 2, new_execution_id="src-b")
    h.signal("src-b", "go", "again")
    h.reset("src-b", 2, new_execution_id="src-c")
    h.signal("src-c", "go", "third")
    assert {h.describe(r).status for r in ("src", "src-b", "src-c")} == {"COMPLETED"}
    assert all(holds_secret(h, r) for r in ("src", "src-b", "src-c"))


def test_erasing_a_run_whose_forks_hold_copies_is_refused_naming_them(app, db):
    h = app.harvest
    reset_family(h)
    before = state(db)
    with pytest.raises(ForksHoldCopies) as refused:
        h.erase_payloads("src")
    assert refused.value.forks == ["src-b", "src-c"]  # the fork's fork too
    assert "'src-b', 'src-c' hold copies" in str(refused.value) and "with_forks" in str(refused.value)
    assert isinstance(refused.value, InvalidState)  # a 409 like any other refused erasure
    # a fork holds its source's payloads too: erasing it alone is refused the same way
    with pytest.raises(ForksHoldCopies) as refused:
        h.erase_payloads("src-b")
    assert refused.value.forks == ["src", "src-c"]
    assert state(db) == before  # nothing written


def test_with_forks_erases_the_whole_family_at_once_and_stays_idempotent(app, db):
    h = app.harvest
    reset_family(h)
    counts = h.erase_payloads("src-c", with_forks=True)
    assert counts["execution_id"] == "src-c" and counts["forks"] == ["src", "src-b"]
    assert counts["fields"] > 0
    for run_id in ("src", "src-b", "src-c"):
        assert h.describe(run_id).erased_at is not None
        assert not holds_secret(h, run_id), run_id
    again = h.erase_payloads("src")  # the family is erased: nothing refuses, nothing to do
    assert (again["events"], again["fields"], again["blobs"]) == (0, 0, 0)


def test_with_forks_is_all_or_nothing_when_a_fork_is_still_live(app, db):
    h = app.harvest
    h.start_workflow("op_gate", {"card": SECRET}, execution_id="live-src")
    h.signal("live-src", "go", "yes")
    h.reset("live-src", 2, new_execution_id="live-fork")  # waits for its signal: RUNNING
    before = state(db)
    with pytest.raises(InvalidState, match="'live-fork': it is RUNNING"):
        h.erase_payloads("live-src", with_forks=True)
    assert state(db) == before
    assert holds_secret(h, "live-src")


def test_a_dag_retry_is_a_fork_too(app, db):
    h = app.harvest
    source = h.start_workflow("op_retryable", {"card": SECRET}, execution_id="dag-1")
    assert h.describe(source).status == "FAILED"
    retried = h.retry_dag_run("op_retryable", source, new_execution_id="dag-1b")["run_id"]
    assert h.describe(retried).status == "COMPLETED" and holds_secret(h, retried)
    with pytest.raises(ForksHoldCopies) as refused:
        h.erase_payloads(source)
    assert refused.value.forks == ["dag-1b"]
    assert h.erase_payloads(source, with_forks=True)["forks"] == ["dag-1b"]
    assert not holds_secret(h, source) and not holds_secret(h, retried)


def test_a_run_without_forks_is_erased_as_before(app, db):
    h = app.harvest
    h.start_workflow("op_gate", {"card": SECRET}, execution_id="alone")
    h.signal("alone", "go", "yes")
    counts = h.erase_payloads("alone", with_forks=True)
    assert counts["forks"] == [] and counts["fields"] > 0 and not holds_secret(h, "alone")


# ── the CLI ──────────────────────────────────────────────────────────────────────────────────
def cli(capsys, *argv):
    code = main(["--app", APP, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_erase_refuses_while_forks_hold_copies_and_with_forks_erases_them(app, db, capsys):
    h = app.harvest
    reset_family(h)
    before = state(db)
    code, out, err = cli(capsys, "erase", "src")
    assert code == 2 and out == ""
    assert err.startswith("harvest: error: cannot erase the payloads of execution 'src': ")
    assert "'src-b', 'src-c'" in err and "--with-forks" in err
    assert state(db) == before
    code, out, err = cli(capsys, "erase", "src", "--with-forks")
    assert (code, err) == (0, "")
    assert out.startswith("erased src: ") and out.splitlines()[1] == "  with its fork family: src-b, src-c"
    assert not any(holds_secret(h, r) for r in ("src", "src-b", "src-c"))


def test_a_live_fork_is_refused_for_its_own_state_first(app, db):
    h = app.harvest
    h.start_workflow("op_gate", {"card": SECRET}, execution_id="s2")
    h.signal("s2", "go", "yes")
    h.reset("s2", 2, new_execution_id="s2-live")
    with pytest.raises(InvalidState, match="'s2-live': it is RUNNING") as refused:
        h.erase_payloads("s2-live")
    assert not isinstance(refused.value, ForksHoldCopies)
