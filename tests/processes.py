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


def strays(environ_marks: dict[str, str], programs: tuple[str, ...] = ("celery", "flower")) -> list[int]:
    """The pids of leftover processes of an earlier run of the same suite: a ``celery`` or
    ``flower`` process whose environment carries every one of ``environ_marks`` (the run's
    database and broker URLs). A run killed before its teardown (a CI timeout, a ``kill -9`` of
    pytest) leaves its workers behind, since each has a session of its own; such a worker
    consumes the next run's queues on the same broker and acks its messages against another
    database. Runs on other databases or brokers (another slot, the fault suite) never match."""
    own = {os.getpid(), os.getppid()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in own:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:  # gone, or not ours to read
            continue
        if not any(os.path.basename(arg).decode(errors="replace") in programs for arg in argv[:4]):
            continue
        if all(env.get(k.encode()) == v.encode() for k, v in environ_marks.items()):
            found.append(int(entry))
    return found


def reap(pids: list[int]) -> None:
    """SIGKILL each leftover process's group (its pool children go with it)."""
    for pid in pids:
        try:
            group = os.getpgid(pid)
            if group == os.getpgrp():  # never this run's own group: that one process only
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
