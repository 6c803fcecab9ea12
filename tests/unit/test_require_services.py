"""The ``HARVEST_REQUIRE_SERVICES`` switch (tests/require_services.py, set by ``.ci/run``): a test
skipped for a missing Postgres, Redis, RabbitMQ or PgBouncer fails under it; without it, and for
any other reason, a skip stays a skip. Real pytest runs of a file that skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SKIPPING = """
import pytest
from tests.require_services import missing

def test_needs_rabbitmq():
    missing("RabbitMQ", "no rabbitmqctl on PATH")

def test_skips_for_pgbouncer():
    pytest.skip("PgBouncer is not installed")

def test_skips_for_another_reason():
    pytest.skip("needs the git history")
"""


def _run(tmp_path: Path, switch: str | None) -> tuple[int, str]:
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "HARVEST_REQUIRE_SERVICES"}
    env["PYTHONPATH"] = str(ROOT)
    if switch is not None:
        env["HARVEST_REQUIRE_SERVICES"] = switch
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.require_services",
            "-p",
            "no:cacheprovider",
            "-rA",
            "-q",
            str(tmp_path / "test_skipping.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout


def test_without_the_switch_a_missing_service_is_a_skip(tmp_path: Path) -> None:
    code, out = _run(tmp_path, None)
    assert code == 0, out
    assert "3 skipped" in out


def test_under_the_switch_a_missing_service_fails_and_another_skip_stays(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "1")
    assert code == 1, out
    assert "2 failed, 1 skipped" in out
    assert "FAILED test_skipping.py::test_needs_rabbitmq" in out
    assert "FAILED test_skipping.py::test_skips_for_pgbouncer" in out
    assert "SKIPPED [1] test_skipping.py:12: needs the git history" in out
