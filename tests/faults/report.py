"""Run the fault suite and write ``docs/reliability.md`` from what it measured.

    python -m tests.faults.report          # the library's default timings (HARVEST_FAULTS_FULL=1)
    python -m tests.faults.report --ci     # the short CI timings (what .ci/run uses)

Each fault test appends one row (runs, lost, duplicated, uncompensated, recovery time) to a
results file; this script runs ``pytest tests/faults`` with that file in a temp directory, then
renders the table with the versions and timings it ran under. The suite's own exit status is
passed on (an ``xfail`` test — a known engine bug — does not fail it; its row says so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"

CI_TIMINGS = (
    "`Timings(default_lease=3, redispatch_after=2, nd_retry_initial=0.5, nd_retry_max=2, "
    "outcome_retry_for=60)`, `sweep_interval=0.3`, Redis `visibility_timeout=30`, "
    "Postgres outage 10 s"
)
FULL_TIMINGS = (
    "the library's defaults: `Timings()` (`default_lease=60`, `redispatch_after=30`, "
    "`nd_retry_initial=1`, `nd_retry_max=300`, `outcome_retry_for=300`), "
    "`sweep_interval=1.0`, Redis `visibility_timeout=3600`, Postgres outage 20 s"
)


def run_suite(full: bool, results: Path, extra: list[str]) -> tuple[int, str, float]:
    env = dict(os.environ, HARVEST_FAULTS_RESULTS=str(results))
    env["HARVEST_FAULTS_FULL"] = "1" if full else "0"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/faults", "-q", "-p", "no:cacheprovider", "-rxX", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    sys.stdout.write(proc.stdout[-6000:])
    sys.stderr.write(proc.stderr[-3000:])
    summary = next(
        (
            line.strip("= ")
            for line in reversed(proc.stdout.splitlines())
            if " in " in line and ("passed" in line or "failed" in line)
        ),
        "(no summary)",
    )
    return proc.returncode, summary, wall


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def _server_versions() -> str:
    out = []
    for cmd in (["redis-server", "--version"],):
        try:
            text = subprocess.run(cmd, capture_output=True, text=True).stdout.split()
            out.append(next((t for t in text if t.startswith("v=")), "v=?")[2:])
        except OSError:
            out.append("?")
    from tests.faults.servers import pg_bin

    try:
        pg = subprocess.run([str(pg_bin() / "postgres"), "--version"], capture_output=True, text=True).stdout
    except (OSError, RuntimeError):
        pg = ""
    words = pg.split()
    return f"PostgreSQL {words[2] if len(words) > 2 else '?'}, Redis {out[0]}"


def _cell(value: object) -> str:
    return "—" if value is None else str(value)


SECTIONS = ("full", "ci", "broker", "regressions")  # the last two are kept as written
HEADER = [
    "# Reliability: the fault suite's measurements",
    "",
    "Written by `python -m tests.faults.report` (library default timings) and "
    "`python -m tests.faults.report --ci` (CI timings) from actual runs of `tests/faults/` "
    "(see [tests/faults/README.md](../tests/faults/README.md)); each command rewrites its own "
    "section. Do not edit by hand.",
    "",
    "Workload, per fault: 4-step sagas (every second run fails at its last step and unwinds steps "
    "3, 2, 1); a `decider` worker (queue `harvest`, the sweeper) and an `acts` worker (every "
    "activity and compensation), both `celery worker -P threads -c 4`, on a Postgres and a Redis "
    "the suite starts and owns; the RabbitMQ rows (`tests/faults/test_rabbitmq.py`) move both "
    "workers onto a RabbitMQ node the suite starts and owns (its own ports, node name and data "
    "directory, `consumer_timeout` 5 s), classic queues, or quorum queues with a delivery limit "
    "of 1 set by policy.",
    "",
]


def render_section(rows: list[dict], full: bool, summary: str, wall: float) -> str:
    title = "Library default timings" if full else "CI timings"
    lines = [
        f"## {title}",
        "",
        f"* **Timings:** {FULL_TIMINGS if full else CI_TIMINGS}.",
        f"* **Run:** {time.strftime('%Y-%m-%d', time.gmtime())}: {summary}; wall time {wall:.0f} s "
        f"on {os.cpu_count()} cores ({platform.python_implementation()} {platform.python_version()}).",
        f"* **Versions:** celery {_version('celery')}, kombu {_version('kombu')}, "
        f"redis-py {_version('redis')}, SQLAlchemy {_version('SQLAlchemy')}, {_server_versions()}.",
        "",
        "| fault | broker | runs | lost | duplicated | uncompensated | recovery (s) | note |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        note = row.get("known_bug") or ("; ".join(row["problems"][:2]) if row["problems"] else "")
        note = note if len(note) <= 300 else note[:297] + "..."
        lines.append(
            f"| {row['fault']} | {row.get('broker', 'Redis')} | {row['runs']} | {row['lost']} | {row['duplicated']} | "
            f"{row['uncompensated']} | {_cell(row['recovery_s'])} | {note} |"
        )
    return "\n".join(lines) + "\n"


def merge(existing: str, section: str, full: bool) -> str:
    """The document with this mode's section replaced; the other sections (the other mode's,
    the hand-written broker matrix) kept as they were."""
    sections = {}
    for mode in SECTIONS:
        start, end = f"<!-- section:{mode} -->", f"<!-- /section:{mode} -->"
        if start in existing and end in existing:
            sections[mode] = existing[existing.index(start) + len(start) : existing.index(end)].strip("\n")
    sections["full" if full else "ci"] = section.strip("\n")
    body = [
        f"<!-- section:{mode} -->\n{sections[mode]}\n<!-- /section:{mode} -->\n"
        for mode in SECTIONS
        if mode in sections
    ]
    return "\n".join(HEADER) + "\n" + "\n".join(body) + "\n" + "\n".join(COLUMNS) + "\n"


COLUMNS = [
    "**Columns.** *runs*: runs started for the fault. *lost*: runs not terminal by the "
    "recovery deadline, or an effect a body did that the history does not record. "
    "*duplicated*: anything recorded or run twice — two results or starts for one (activity, "
    "attempt), a second completion of an activity, a body run twice for one attempt, a saga "
    "marker recorded twice, more than one terminal event, a seq gap (a forked history). "
    "*uncompensated*: a forward step whose effect happened in a run whose saga unwound, with "
    "no compensation effect. *recovery*: seconds from the end of the fault (the kill, the "
    "server back, the hung body let go) until every run of the fault was terminal; — when "
    "they were not (the row's test is an `xfail`: a known engine bug, named in the note). "
    "Every row also requires every worker process alive at the end (restarted only when the "
    "test killed it).",
    "",
    "The recovery times follow the timings: a killed activity attempt waits for its lease "
    "(`default_lease` + 5 s) to expire, a lost message for `redispatch_after` (each later "
    "re-send waits longer), an unacked message for the broker's visibility timeout.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ci", action="store_true", help="the short CI timings instead of the defaults")
    parser.add_argument("--output", type=Path, default=DOC)
    args, extra = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="harvest-faults-report-") as tmp:
        results = Path(tmp) / "results.jsonl"
        code, summary, wall = run_suite(not args.ci, results, extra)
        rows = (
            [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
            if results.exists()
            else []
        )
    if not rows:
        print("no fault rows were written: docs not updated", file=sys.stderr)
        return code or 1
    existing = args.output.read_text() if args.output.exists() else ""
    args.output.write_text(merge(existing, render_section(rows, not args.ci, summary, wall), not args.ci))
    print(f"wrote {args.output} ({len(rows)} faults, {wall:.0f} s)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
