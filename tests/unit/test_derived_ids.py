"""Derived ids: one function makes every id the engine derives from another (a child's default
id, a continue-as-new link, the fork of a reset or a DAG retry), and it always returns a legal
id — a 200-character source, or one made before the id rules, included."""

from __future__ import annotations

import sys

import pytest

from harvest_celery import InvalidExecutionId
from harvest_celery._cli import main
from harvest_celery._core.ids import MAX_ID_LENGTH, check_execution_id, child_id, derived_id

APP = "tests.unit.cli_operator_app"
LONGEST = "x" * MAX_ID_LENGTH


def test_a_short_source_gets_its_suffix_appended():
    assert derived_id("order-7", "reset-1f2e3d4c") == "order-7-reset-1f2e3d4c"
    assert child_id("order-7", 1) == "order-7-c1"
    assert child_id("order-7", 12) == "order-7-c12"


@pytest.mark.parametrize("length", [185, 190, 196, 197, 199, 200])
@pytest.mark.parametrize("suffix", ["c1", "c12345", "reset-1f2e3d4c", "retry-00aa11bb", "n4999"])
def test_a_long_source_gets_a_legal_id_of_at_most_200_characters(length, suffix):
    source = ("a" * (length - 1)) + "z"
    made = derived_id(source, suffix)
    assert check_execution_id(made) == made
    assert len(made) <= MAX_ID_LENGTH
    assert made.endswith(f"-{suffix}")  # the suffix stays readable
    assert made.startswith("a" * 20)  # and so does the head of the source


def test_the_hashed_id_is_deterministic_and_tells_sources_and_suffixes_apart():
    a, b = "a" * 199 + "1", "a" * 199 + "2"  # the same head: only the hash separates them
    assert derived_id(a, "c1") == derived_id(a, "c1")
    assert len({derived_id(a, "c1"), derived_id(b, "c1"), derived_id(a, "c2")}) == 3
    # a child of a child of a 200-character parent is still legal and distinct
    grandchild = child_id(child_id(LONGEST, 1), 1)
    assert check_execution_id(grandchild) == grandchild and grandchild != child_id(LONGEST, 1)


def test_the_plain_form_is_kept_exactly_up_to_200_characters():
    source = "s" * (MAX_ID_LENGTH - len("-c1"))
    assert derived_id(source, "c1") == source + "-c1"
    assert derived_id(source + "s", "c1") != source + "s-c1"  # 201 characters: hashed


def test_a_source_made_before_the_rules_still_derives_a_legal_id():
    for source in ("legacy:run", "a/b", "tab\there", " " * 5):
        made = derived_id(source, "reset-0badf00d")
        assert check_execution_id(made) == made


def test_an_illegal_suffix_is_refused():
    with pytest.raises(InvalidExecutionId):
        derived_id("order-7", "c:1")


@pytest.fixture
def app(cli_db, capsys):
    cli_db(APP)
    assert main(["--app", APP, "list"]) == 0
    capsys.readouterr()
    return sys.modules[APP]


def test_reset_of_a_200_character_run_makes_a_legal_fork(app):
    h = app.harvest
    h.start_workflow("op_gate", {"card": "c"}, execution_id=LONGEST)
    h.signal(LONGEST, "go", "yes")
    fork = h.reset(LONGEST, 2)
    assert check_execution_id(fork) == fork and "-reset-" in fork and len(fork) <= MAX_ID_LENGTH
    assert h.describe(fork).status == "RUNNING"  # a real run under the derived id


def test_retry_of_a_200_character_dag_run_makes_a_legal_fork(app):
    h = app.harvest
    h.start_workflow("op_retryable", {}, execution_id="d" * MAX_ID_LENGTH)
    assert h.describe("d" * MAX_ID_LENGTH).status == "FAILED"
    fork = h.retry_dag_run("op_retryable", "d" * MAX_ID_LENGTH)["run_id"]
    assert check_execution_id(fork) == fork and "-retry-" in fork
    assert h.describe(fork).status == "COMPLETED"
