"""What a newcomer trips over (issue 19, item 8): the quickstart's database step, the Django
page's Celery app, ``harvest show``'s tracebacks, ``harvest worker --help``, ``harvest list |
head``, and the demo's retry and seal-cancel cases."""

from __future__ import annotations

import io
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from harvest_celery._cli import main
from harvest_celery._core.timeline import render_errors
from harvest_celery._demo import run_demo

ROOT = Path(__file__).resolve().parents[2]

# A Python 3.11 traceback as an attempt records it: its last four lines start with the caret line
# of the frame above the innermost one.
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/harvest_celery/_runtime/runtime.py", line 548, in execute\n'
    "    output = fn(claim.input)\n"
    "             ^^^^^^^^^^^^^^^\n"
    '  File "/srv/shop/checkout.py", line 34, in reserve_inventory\n'
    "    raise RuntimeError(f\"no stock for order {order['order_id']}\")\n"
    "RuntimeError: no stock for order 3\n"
)


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[str, str]]:
    """The demo's output, and the url of the database it kept."""
    out = io.StringIO()
    assert run_demo(out, keep=True) == 0
    text = out.getvalue()
    workdir = re.search(r"^kept (\S+);", text, re.M)
    assert workdir, text[-500:]
    yield text, f"sqlite:///{Path(workdir.group(1)) / 'harvest.db'}"
    shutil.rmtree(workdir.group(1), ignore_errors=True)


def section(out: str, label: str) -> list[str]:
    start = out.index(f"\n== ({label}) ")
    end = min(i for i in (out.find("\n== (", start + 1), out.index("\nsummary:")) if i >= 0)
    return out[start:end].strip("\n").splitlines()


def test_the_demos_retry_shows_the_failed_attempt_between_its_two_starts(demo):
    lines = section(demo[0], "c")
    first = next(
        i for i, x in enumerate(lines) if "ActivityStarted" in x and "reserve_inventory #2 attempt=1" in x
    )
    second = next(
        i for i, x in enumerate(lines) if "ActivityStarted" in x and "reserve_inventory #2 attempt=2" in x
    )
    between = lines[first + 1 : second]
    assert len(between) == 1, between
    assert "reserve_inventory #2 attempt=1 RuntimeError: no stock for order 3" in between[0]


def test_the_seal_cancel_case_explains_before_it_shows_the_error(demo):
    lines = section(demo[0], "d")
    alarming = [i for i, x in enumerate(lines) if "SagaCompensationFailed" in x]
    status = next(i for i, x in enumerate(lines) if x.startswith("demo-checkout-4  checkout  CANCELLED"))
    explanation = next(i for i, x in enumerate(lines) if "known limitation" in x)
    action = next(i for i, x in enumerate(lines) if "an operator cancels the run now" in x)
    assert explanation == 1, lines[:3]  # right under the title, before anything happens
    assert explanation <= alarming[0] < action < status  # the error is first named by the explanation


def test_show_cuts_every_attempts_traceback_at_a_frame_with_the_failure_in_its_timeline(demo, capsys):
    assert main(["--database-url", demo[1], "show", "demo-checkout-3"]) == 0
    out = capsys.readouterr().out
    errors = out[out.index("errors (every attempt):") :].splitlines()[1:]
    # each attempt's traceback: its innermost frame and the exception, never a dangling caret line
    heads = [i for i, line in enumerate(errors) if line.startswith(("  activity #", "  workflow: "))]
    assert len(heads) == 3, errors  # two attempts of reserve_inventory, then the workflow's failure
    for i in heads:
        assert errors[i + 1].strip().startswith('File "'), errors[i : i + 3]
    timeline = out[out.index("timeline:") : out.index("errors (every attempt):")].splitlines()
    assert any(
        "attempt=1 RuntimeError: no stock for order 3" in x and "ActivityFailed" not in x for x in timeline
    )


def test_render_errors_starts_each_traceback_at_its_innermost_frame():
    error = SimpleNamespace(
        activity_id="2",
        attempt=1,
        error_type="RuntimeError",
        message="no stock for order 3",
        traceback=TRACEBACK,
        recorded_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
    )
    assert render_errors([error]) == [
        "activity #2 attempt 1: RuntimeError: no stock for order 3",
        '      File "/srv/shop/checkout.py", line 34, in reserve_inventory',
        "        raise RuntimeError(f\"no stock for order {order['order_id']}\")",
        "    RuntimeError: no stock for order 3",
    ]
    chained = (
        TRACEBACK + "\nDuring handling of the above exception, another exception occurred:\n\n" + TRACEBACK
    )
    assert (
        render_errors([SimpleNamespace(**{**vars(error), "traceback": chained})])[1:]
        == render_errors([error])[1:]
    )
    bare = SimpleNamespace(**{**vars(error), "traceback": "RuntimeError: no stock\n"})  # no frame at all
    assert render_errors([bare])[1:] == ["    RuntimeError: no stock"]


def test_worker_help_lists_the_app_option(capsys):
    assert main(["worker", "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  -A APP, --app APP\s+module\[:attr\] of a Harvest instance", out, re.M), out


def test_list_into_a_closed_pipe_exits_quietly(demo, tmp_path):
    """``harvest list | head``: the reader is gone before the first line is written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    read, write = os.pipe()
    os.close(read)  # the reader closes early: every write meets a closed pipe
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "harvest_celery", "--database-url", demo[1], "list"],
            stdout=write,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=env,
            timeout=60,
        )
    finally:
        os.close(write)
    assert proc.stderr.decode() == ""
    assert proc.returncode == 141  # 128 + SIGPIPE, as a Unix tool killed by it


def test_list_into_head_prints_the_first_line_and_nothing_on_stderr(demo, tmp_path):
    """``harvest list | head -n 1`` over more runs than a pipe holds: the reader takes one line and
    closes while harvest is still writing."""
    url = f"sqlite:///{tmp_path / 'crowded.db'}"
    with (
        sqlite3.connect(demo[1].removeprefix("sqlite:///")) as source,
        sqlite3.connect(tmp_path / "crowded.db") as copy,
    ):
        source.backup(copy)  # the demo's database is in WAL mode: a file copy could miss rows
    engine = sa.create_engine(url)
    runs = sa.Table("harvest_executions", sa.MetaData(), autoload_with=engine)
    with engine.begin() as conn:
        row = dict(conn.execute(sa.select(runs).limit(1)).mappings().one())
        conn.execute(runs.insert(), [{**row, "id": f"crowd-{i:05d}-" + "x" * 60} for i in range(2000)])
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    harvest = subprocess.Popen(
        [sys.executable, "-m", "harvest_celery", "--database-url", url, "list", "--limit", "2000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    assert harvest.stdout is not None and harvest.stderr is not None
    head = harvest.stdout.readline()
    harvest.stdout.close()
    assert harvest.wait(timeout=60) == 141
    assert head.split()[:3] == [b"ID", b"WORKFLOW", b"STATUS"]
    assert harvest.stderr.read() == b""


def test_the_quickstart_creates_the_role_and_database_before_first_use():
    text = (ROOT / "docs" / "quickstart.md").read_text()
    assert "createdb" in text and "createuser" in text
    assert text.index("createuser") < text.index("createdb") < text.index("harvest db upgrade")


def test_the_django_pages_celery_app_keeps_its_own_configuration():
    text = (ROOT / "docs" / "django.md").read_text()
    block = re.search(r"```python\n# proj/celery\.py\n(.*?)```", text, re.S)
    assert block, "docs/django.md shows proj/celery.py"
    assert "configure_" not in block.group(1)  # configure_celery is for an app made only for harvest
    flask = (ROOT / "docs" / "flask.md").read_text()
    extension = re.search(r"```python\n# shop/extensions\.py\n(.*?)```", flask, re.S)
    assert extension and "configure_" not in extension.group(1)
