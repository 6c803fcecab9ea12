"""Stopping the server and worker processes the test suites start, each in its own process group
(``start_new_session=True``), so a worker's pool children go with it."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def stop_group(proc: subprocess.Popen[Any] | None, timeout: float = 15) -> None:
    """SIGTERM the group (a warm shutdown), SIGKILL it if it is not gone after ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """kill -9 of the whole group, waited for."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
