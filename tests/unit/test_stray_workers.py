"""The integration suite kills the workers an earlier run on its database and broker left behind
(tests/processes.py ``strays`` / ``reap``), and nothing else."""

from __future__ import annotations

import os
import subprocess
import time

from tests.processes import reap, strays

MARKS = {
    "HARVEST_TEST_DATABASE_URL": "postgresql://x/harvest_it_unit",
    "HARVEST_TEST_BROKER_URL": "redis://x/99",
}


def _spawn(name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A process whose argv[0] is ``name`` (as ``python -m celery`` puts ``celery`` in argv)."""
    return subprocess.Popen(
        ["bash", "-c", f"exec -a {name} sleep 60"], env={**os.environ, **env}, start_new_session=True
    )


def _wait_exec(proc: subprocess.Popen[bytes], name: str) -> None:
    for _ in range(100):
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            if f.read().split(b"\0")[0] == name.encode():
                return
        time.sleep(0.02)
    raise AssertionError(f"{proc.pid} never became {name}")


def test_a_leftover_worker_of_the_same_database_and_broker_is_found_and_killed() -> None:
    ours = _spawn("celery", MARKS)
    other_slot = _spawn("celery", {**MARKS, "HARVEST_TEST_BROKER_URL": "redis://x/98"})
    not_a_worker = _spawn("sleeper", MARKS)
    try:
        for proc, name in ((ours, "celery"), (other_slot, "celery"), (not_a_worker, "sleeper")):
            _wait_exec(proc, name)
        found = strays(MARKS)
        assert ours.pid in found
        assert other_slot.pid not in found and not_a_worker.pid not in found
        reap(found)
        assert ours.wait(timeout=5) == -9
        assert other_slot.poll() is None and not_a_worker.poll() is None
    finally:
        for proc in (ours, other_slot, not_a_worker):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
