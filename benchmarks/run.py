"""Side-by-side performance harness: harvest-celery vs raw Celery vs DBOS, one run, one table.

    python -m benchmarks.run                        # every scenario, ~5 min on 2 cores
    python -m benchmarks.run --quick                # every scenario, shortened, ~2 min
    python -m benchmarks.run --scenarios sequential,history --skip-dbos

Scenarios: sequential (B1), throughput (B2), history (B3), fanout (B4), canvas (B5), memory, limits,
micro, schedules (tick lateness, harvest scheduler against Celery Beat); and tracing (B1 with
tracing on against off, run only when named: --scenarios tracing). Same
Postgres (127.0.0.1:5432; databases ``harvest_bench`` and ``dbos_bench`` recreated each run) and
Redis (127.0.0.1:6379, DB 7 flushed each run) for every system. Writes
benchmarks/results/latest.json and the two plots; see benchmarks/README.md for what each number
means. Nothing here is a test: there are no timed assertions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import micro, report
from benchmarks.common import (
    DBOS_DB,
    DBOS_URL,
    HARVEST_DB,
    REDIS_URL,
    RESULTS,
    ROOT,
    error_text,
    fresh_database,
    log,
    split_topology,
)
from benchmarks.scenarios import (
    admission,
    canvas,
    fanout,
    history,
    limits,
    memory,
    schedules,
    sequential,
    throughput,
    tracing,
)

SCENARIOS = {
    "sequential": sequential.run,
    "throughput": throughput.run,
    "history": history.run,
    "fanout": fanout.run,
    "canvas": canvas.run,  # B5: a 1,000-task chord, start_canvas against plain Celery's chord
    "memory": memory.run,
    "limits": limits.run,
    "micro": lambda args, _d: micro.run(args),
    "tracing": tracing.run,  # B1 with tracing on and off; not in the default set (--scenarios tracing)
    "admission": admission.run,  # workflow admission; not in the default set (--scenarios admission)
    "schedules": schedules.run,  # last: it leaves open runs no worker has taken
}
DEFAULT = [s for s in SCENARIOS if s not in ("tracing", "admission")]
# (full, --quick) defaults of the size knobs
PROFILES: dict[str, tuple[Any, Any]] = {
    "steps": (20, 10),
    "runs": (20, 3),
    "inflight": ([1, 4, 16, 64], [1, 4, 16, 64]),
    "min_jobs": (32, 8),
    "history_steps": (1000, 300),
    "fanout_cells": (1000, 200),
    "canvas_cells": (1000, 200),
    "memory_runs": (1000, 200),
    "budget_steps": (100, 40),
    "repeats": (5, 3),
    "chain_iterations": (20000, 5000),
    "sched_count": (1000, 1000),
    "sched_every": (20, 10),
    "sched_rounds": (5, 3),
    "hot_runs": (400, 160),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenarios",
        default=",".join(DEFAULT),
        help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all but tracing and admission)",
    )
    p.add_argument("--quick", action="store_true", help="shortened sizes (about 2 minutes)")
    p.add_argument("--steps", type=int, help="B1/B2: steps per workflow (20; quick 10)")
    p.add_argument("--runs", type=int, help="B1: measured workflows per topology (20; quick 3)")
    p.add_argument(
        "--inflight",
        type=lambda s: [int(c) for c in s.split(",")],
        help="B2: workflows in flight, comma-separated (1,4,16,64)",
    )
    p.add_argument("--repeats", type=int, help="B2: interleaved repeats per level (5; quick 3)")
    p.add_argument(
        "--b2-topology",
        choices=("pair", "split"),
        default="pair",
        help="B2's workers: pair (2 processes, each every queue) or split (a decision "
        "worker -Q harvest and an activity worker -Q default,bench)",
    )
    p.add_argument(
        "--topology",
        choices=("split", "shared"),
        help="B2's workers (the same as --b2-topology): split (the documented deployment) or "
        "shared (every process every queue: --b2-topology pair)",
    )
    p.add_argument(
        "--pool",
        choices=("threads", "prefork"),
        default="threads",
        help="the workers' Celery pool (-P), for harvest and raw Celery alike",
    )
    p.add_argument(
        "--broker",
        choices=("redis", "amqp"),
        default="redis",
        help="redis (redis://127.0.0.1:6379/7) or amqp (HARVEST_BENCH_AMQP_URL, default "
        "amqp://guest:guest@127.0.0.1:5672//), for harvest and raw Celery alike",
    )
    p.add_argument(
        "--decision-procs",
        type=int,
        default=1,
        help="--topology split: decision worker processes (1); the scale-out table uses 1 and 2",
    )
    p.add_argument(
        "--activity-procs",
        type=int,
        default=1,
        help="--topology split: activity worker processes (1); the scale-out table uses 1, 2, 4, 8",
    )
    p.add_argument("--min-jobs", type=int, help="B2: workflows per level at least (32; quick 8)")
    p.add_argument("--history-steps", type=int, help="B3: steps in the one long run (1000; quick 300)")
    p.add_argument(
        "--chain-iterations", type=int, help="B3: steps of the continue-as-new loop (20000; quick 5000)"
    )
    p.add_argument("--sched-count", type=int, help="schedules: schedules and Beat entries (1000)")
    p.add_argument("--sched-every", type=int, help="schedules: their interval, seconds (20; quick 10)")
    p.add_argument("--sched-rounds", type=int, help="schedules: ticks measured per system (5; quick 3)")
    p.add_argument("--hot-runs", type=int, help="admission: one-step runs of the hot key (400; quick 160)")
    p.add_argument("--fanout-cells", type=int, help="B4: mapped cells (1000; quick 200)")
    p.add_argument("--canvas-cells", type=int, help="B5: chord header tasks (1000; quick 200)")
    p.add_argument("--memory-runs", type=int, help="memory: warm runs (1000; quick 200)")
    p.add_argument("--budget-steps", type=int, help="B1: steps of the counted probe run (100; quick 40)")
    p.add_argument("--worker-concurrency", type=int, default=4, help="celery -c (threads) per worker")
    p.add_argument("--skip-dbos", action="store_true")
    p.add_argument("--json", type=Path, default=RESULTS / "latest.json")
    p.add_argument(
        "--plots-dir",
        type=Path,
        default=RESULTS,
        help="where the two PNGs go (docs use --plots-dir docs/img)",
    )
    args = p.parse_args(argv)
    for key, (full, quick) in PROFILES.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.topology is not None:
        args.b2_topology = {"split": "split", "shared": "pair"}[args.topology]
    if (args.decision_procs, args.activity_procs) != (1, 1):
        if args.topology != "split":
            p.error("--decision-procs/--activity-procs need --topology split")
        args.b2_topology = split_topology(args.decision_procs, args.activity_procs)
    deployment_env(args.pool, args.broker)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    if (
        min(
            args.steps,
            args.runs,
            args.history_steps,
            args.fanout_cells,
            args.canvas_cells,
            args.memory_runs,
            args.budget_steps,
            args.repeats,
            args.chain_iterations,
            args.sched_count,
            args.sched_every,
            args.sched_rounds,
            args.decision_procs,
            args.activity_procs,
            args.hot_runs,
            *args.inflight,
        )
        < 1
    ):
        p.error("sizes must be >= 1")
    return args


def deployment_env(pool: str, broker: str) -> None:
    """The pool and broker every worker (and this client) uses: through the environment, which
    benchmarks.app and the worker subprocesses read."""
    os.environ["HARVEST_BENCH_POOL"] = pool
    if broker == "amqp":
        os.environ["HARVEST_BENCH_BROKER_URL"] = os.environ.get(
            "HARVEST_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"
        )


# ── DBOS: one subprocess for every DBOS part of the selected scenarios ───────────────────────
DBOS_PARTS = {
    "sequential": "sequential",
    "throughput": "throughput",
    "history": "history",
    "fanout": "fanout",
}


def run_dbos(args: argparse.Namespace) -> dict[str, Any]:
    parts = [DBOS_PARTS[s] for s in args.scenarios if s in DBOS_PARTS]
    if args.skip_dbos:
        return {p: {"error": "skipped (--skip-dbos)"} for p in parts}
    if not parts:
        return {}
    try:
        import dbos  # noqa: F401
    except ImportError:
        return {
            p: {"error": "the `dbos` package is not installed (pip install -e '.[bench]')"} for p in parts
        }
    log(f"DBOS ({', '.join(parts)}), in its own process…")
    try:
        fresh_database(DBOS_DB)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.dbos_bench",
                "--url",
                DBOS_URL,
                "--parts",
                ",".join(parts),
                "--steps",
                str(args.steps),
                "--runs",
                str(args.runs),
                "--inflight",
                ",".join(map(str, args.inflight)),
                "--min-jobs",
                str(args.min_jobs),
                "--history-steps",
                str(args.history_steps),
                "--fanout-cells",
                str(args.fanout_cells),
            ],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=900,
        )
    except Exception as exc:  # noqa: BLE001 - reported, the harness carries on
        return {p: {"error": error_text(exc)} for p in parts}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        return {p: {"error": f"DBOS run failed (exit {proc.returncode}): {tail}"} for p in parts}
    raw = json.loads(lines[-1])
    return {p: dict(raw.get(p, {"error": "no output"}), version=raw["version"]) for p in parts}


# ── context of a run ─────────────────────────────────────────────────────────────────────────
def machine_info() -> dict[str, Any]:
    import celery
    import redis
    import sqlalchemy as sa

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "celery": celery.__version__,
        "cpu_model": _cpu_model(),
    }
    try:
        info["mem_total_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        engine = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{HARVEST_DB}")
        with engine.connect() as conn:
            info["postgres"] = conn.execute(sa.text("SHOW server_version")).scalar()
            info["synchronous_commit"] = conn.execute(sa.text("SHOW synchronous_commit")).scalar()
        engine.dispose()
        info["redis"] = redis.Redis.from_url(REDIS_URL).info("server")["redis_version"]
    except Exception as exc:  # noqa: BLE001 - informational
        info["error"] = str(exc)
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def git_info() -> dict[str, Any]:
    """The commit measured, and whether the engine's working tree differed from it (tracked
    changes and untracked files under harvest_celery/, hashed together)."""

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    diff = git("diff", "HEAD", "--", "harvest_celery")
    untracked = git("ls-files", "--others", "--exclude-standard", "--", "harvest_celery").split()
    digest = hashlib.sha1(diff.encode())
    for name in untracked:
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    dirty = bool(diff or untracked)
    return {
        "commit": git("log", "--oneline", "-1")[:120],
        "sha": git("rev-parse", "HEAD"),
        "engine_uncommitted_changes": dirty,
        "engine_diff_sha1": digest.hexdigest()[:12] if dirty else None,
        "engine_changed_files": git("diff", "HEAD", "--name-only", "--", "harvest_celery").split(),
        "engine_untracked_files": untracked,
    }


def _finite(value: Any) -> Any:
    """NaN (a ratio with a missing side) becomes null, so the JSON is strict."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def derive_floor(res: dict[str, Any]) -> None:
    """Per B1 topology: the cheapest a step could be given its measured budget — its Postgres
    transactions at the median single-row commit latency plus its broker messages at the raw
    ``celery.chain`` step (which includes Celery's own per-task overhead: generous, not tight)."""
    commit = ((res.get("micro") or {}).get("commit") or {}).get("median_ms")
    for t in ((res.get("sequential") or {}).get("topologies") or {}).values():
        view = (t.get("budget") or {}).get("postgres_view_per_step") or {}
        per_step = (t.get("budget") or {}).get("workers_per_step") or {}
        chain = t["raw_celery"]["celery_chain"]["per_step"]["median_ms"]
        if commit is None or not view:
            continue
        estimate = view["pg_transactions"] * commit + per_step.get("published", 0) * chain
        t["floor"] = {
            "commit_ms": commit,
            "raw_chain_step_ms": chain,
            "estimate_ms": estimate,
            "harvest_over_floor": t["harvest"]["per_step"]["median_ms"] / estimate,
        }


def setup() -> None:
    import redis

    RESULTS.mkdir(parents=True, exist_ok=True)
    log(f"setting up: fresh database {HARVEST_DB}, Redis DB 7 flushed, migrating…")
    redis.Redis.from_url(REDIS_URL).flushdb()
    fresh_database(HARVEST_DB)
    from benchmarks.app import harvest

    harvest.migrate()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t0 = time.monotonic()
    setup()
    config = {k: v for k, v in vars(args).items() if k not in ("json", "plots_dir")}
    res: dict[str, Any] = {
        "config": config,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": git_info(),
        "machine": machine_info(),
    }
    dbos = run_dbos(args)
    failed = []
    for name in args.scenarios:
        try:
            res[name] = SCENARIOS[name](args, dbos.get(DBOS_PARTS.get(name, ""), {}))
        except Exception as exc:  # noqa: BLE001 - one scenario failing keeps the others
            failed.append(name)
            res[name] = {"error": error_text(exc), "traceback": traceback.format_exc()}
            log(f"!! scenario {name} failed: {error_text(exc)}\n{traceback.format_exc()}")
    derive_floor(res)
    res["duration_s"] = time.monotonic() - t0
    if git_info() != res["git"]:  # workers started later import the engine afresh
        res["git"]["changed_during_run"] = True
        log("!! the engine's code changed during the run: the scenarios may have measured different code")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(_finite(res), indent=2, default=str) + "\n")
    print()
    print(report.tables(json.loads(args.json.read_text()), md=False))
    for path in report.plots(res, args.plots_dir):
        log(f"plot written: {path}")
    log(
        f"results written to {args.json} ({res['duration_s']:.0f} s; commit {res['git']['commit'][:60]}"
        f"{', engine has uncommitted changes' if res['git']['engine_uncommitted_changes'] else ''})"
    )
    if failed:
        log(f"failed scenarios: {', '.join(failed)} (see 'error' in the JSON)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
