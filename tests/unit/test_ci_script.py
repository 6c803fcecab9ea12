"""`.ci/run` uses the machine's Postgres and Redis as they are: it may start a server that does
not answer, but never changes a server's settings and never restarts one (the integration suite
fits Postgres' default max_connections: tests/integration/conftest.py's connection peak)."""

from __future__ import annotations

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "run"


def _commands() -> str:
    return "\n".join(line.split("#", 1)[0] for line in SCRIPT.read_text().splitlines())


def test_ci_changes_no_server_setting() -> None:
    commands = _commands()
    assert not re.search(r"alter\s+system", commands, re.I)
    assert not re.search(r"max_connections", commands, re.I)


def test_ci_restarts_no_server() -> None:
    commands = _commands()
    assert not re.search(r"\brestart\b|\breload\b|\bstop\b", commands)
    assert not re.search(r"redis-cli[^\n]*\b(shutdown|config\s+set)\b", commands, re.I)
    # what it may do: start a server that does not answer
    assert re.search(r"pg_isready[^\n]*\n\s*pg_ctlcluster [^\n]* start\b", commands)
