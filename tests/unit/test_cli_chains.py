"""The CLI's ``signal``, ``cancel``, ``request-cancel`` and ``terminate`` addressed to a
continue-as-new chain's first id reach its current run (docs/operations.md, routing); the
earlier links are left as they were."""

from __future__ import annotations

import pytest

from harvest_celery._cli import main

APP = "tests.unit.cli_sched_app:harvest"


@pytest.fixture
def h(cli_db):
    cli_db("tests.unit.cli_sched_app")
    from tests.unit.cli_sched_app import harvest

    return harvest


def chain(h, first: str) -> list[str]:
    ids = [first]
    while (following := h.describe(ids[-1]).continued_to) is not None:
        ids.append(following)
    return ids


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["signal", "c", "last", "10"], "COMPLETED"),
        (["cancel", "c", "--reason", "ops"], "CANCELLED"),
        (["terminate", "c", "--reason", "ops"], "TERMINATED"),
        (["request-cancel", "c", "--reason", "ops"], "CANCELLED"),  # its wait is cancellable
    ],
    ids=["signal", "cancel", "terminate", "request-cancel"],
)
def test_a_command_to_the_first_id_reaches_the_chains_current_run(h, capsys, argv, status):
    assert main(["--app", APP, "start", "cs.chain", "0", "--id", "c"]) == 0
    h.drain()
    ids = chain(h, "c")
    assert len(ids) == 4 and h.describe(ids[-1]).status == "RUNNING"
    assert main(["--app", APP, *argv]) == 0, capsys.readouterr().err
    h.drain()
    assert h.describe(ids[-1]).status == status
    assert [h.describe(i).status for i in ids[:-1]] == ["CONTINUED_AS_NEW"] * 3
    if status == "COMPLETED":
        assert h.result("c") == 13


def test_list_filters_on_continued_as_new(h, capsys):
    assert main(["--app", APP, "start", "cs.chain", "0", "--id", "c"]) == 0
    h.drain()
    ids = chain(h, "c")
    capsys.readouterr()
    assert main(["--app", APP, "list", "--status", "continued_as_new"]) == 0
    out = capsys.readouterr().out
    assert all(i in out for i in ids[:-1]) and ids[-1] not in out
    assert {x.id for x in h.list(status="CONTINUED_AS_NEW")} == set(ids[:-1])
