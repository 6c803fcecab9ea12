"""Where a B2 step's CPU goes, per worker process, harvest against raw Celery (docs/performance.md,
"Where the split gap comes from").

    flock /work/it.lock python -m benchmarks.profile --pool threads --topology split --inflight 16

Starts one cluster (``--topology``, ``--pool``, ``--broker`` as ``benchmarks.run``), then for each
system (harvest, raw Celery) runs a closed loop of ``--inflight`` clients for ``--seconds``, and
reads the CPU seconds (``/proc/<pid>/stat``) of every worker process (pool children included),
of the Postgres, Redis and RabbitMQ processes (all of them: run it under the benchmark lock) and
of this client process, and the run's steps: CPU milliseconds per step per role, and their sum. With ``--py-spy DIR`` it also records each
worker (``py-spy record --subprocesses -f raw``) during each loop, one file per system and role,
for ``benchmarks.profile --fold`` to summarise. With ``--threads``, where the activity threads' time
went, from the histories of the harvest loop's runs (``thread_use``). Needs the same services as ``benchmarks.run``
(and drops its databases the same way). Nothing here is a test.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import Cluster, log
from benchmarks.run import deployment_env, setup
from benchmarks.scenarios.sequential import raw_client_chain
from benchmarks.scenarios.throughput import harvest_job

TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a prefork worker's children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        todo.extend(int(k) for k in kids)
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process tree."""
    total = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def loop(job: Any, inflight: int, seconds: float) -> tuple[int, float]:
    """``inflight`` clients running ``job`` back to back for ``seconds``: jobs done, wall."""
    stop, done, lock = threading.Event(), [0], threading.Lock()

    def client() -> None:
        while not stop.is_set():
            job()
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=client) for _ in range(inflight)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return done[0], time.perf_counter() - t0


SERVERS = {"postgres": "postgres", "redis-server": "redis", "beam.smp": "rabbitmq"}


def servers() -> dict[str, list[int]]:
    """The machine's Postgres, Redis and RabbitMQ processes by role (all of them: run this
    under the machine's benchmark lock, so no other test is using the servers)."""
    out: dict[str, list[int]] = collections.defaultdict(list)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
        except OSError:
            continue
        if comm in SERVERS:
            out[SERVERS[comm]].append(int(d.name))
    return out


def _roles(cluster: Cluster) -> list[tuple[str, list[int], bool]]:
    """(role, pids, with descendants): a worker with its pool children; a server's processes
    and this client process (whose children are the workers) each on their own."""
    roles = [
        (role, [w.proc.pid], True) for w, role in zip(cluster.workers, cluster.roles, strict=True) if w.proc
    ]
    roles += [(role, pids, False) for role, pids in servers().items()]
    return [*roles, ("client", [os.getpid()], False)]


def _cpu(pids: list[int], tree_too: bool) -> float:
    return sum(cpu_s(p) if tree_too else _own_cpu_s(p) for p in pids)


def _own_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def measure(cluster: Cluster, name: str, job: Any, args: argparse.Namespace) -> dict[str, Any]:
    spies = []
    if args.py_spy:
        args.py_spy.mkdir(parents=True, exist_ok=True)
        for i, (w, role) in enumerate(zip(cluster.workers, cluster.roles, strict=True)):
            assert w.proc is not None
            out = args.py_spy / f"{name}-{role}{i}.txt"
            cmd = ["py-spy", "record", "--subprocesses", "-p", str(w.proc.pid), "-d", str(int(args.seconds))]
            cmd += ["-r", "100", "-f", "raw", "-o", str(out), "--nonblocking"]
            spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    roles = _roles(cluster)
    before = [_cpu(pids, t) for _, pids, t in roles]
    jobs, wall = loop(job, args.inflight, args.seconds)
    after = [_cpu(pids, t) for _, pids, t in roles]
    for spy in spies:
        spy.wait(timeout=60)
    steps = jobs * args.steps
    per_role: dict[str, float] = collections.defaultdict(float)
    for (role, _, _), a, b in zip(roles, before, after, strict=True):
        per_role[role] += (b - a) * 1000 / steps
    total = sum(per_role.values())
    return {
        "steps": steps,
        "steps_per_s": steps / wall,
        "cpu_ms_per_step": dict(per_role),
        "cpu_ms_total": total,
    }


def fold(path: Path, top: int = 25) -> list[tuple[float, str]]:
    """A py-spy raw (collapsed) file: the share of samples per leaf-most frame in harvest,
    Celery, kombu, SQLAlchemy, psycopg2 or redis (the first such frame from the leaf)."""
    counts: dict[str, int] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        frames = stack.split(";")
        label = frames[-1]
        for f in reversed(frames):
            if any(
                k in f for k in ("harvest_celery", "sqlalchemy", "psycopg2", "kombu", "celery/", "redis/")
            ):
                label = f
                break
        counts[label] += int(n)
    return [(100 * n / total, k) for k, n in counts.most_common(top)]


def positions(runs: int, steps: int) -> dict[str, Any]:
    """``runs`` sequential runs one after another (B1): the median milliseconds of each step by
    its position — from the previous ``ActivityCompleted`` (or ``WorkflowStarted``) to this one —
    and of the client's share (``start_workflow`` → ``WorkflowStarted``, last event → ``result()``
    returned), so the steps that crossed the broker stand out from the eager ones."""
    import statistics

    from benchmarks.common import harvest_client
    from harvest_celery._core import events as ev

    harvest = harvest_client()
    per: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(runs):
        t0 = time.time()
        execution_id = harvest.start_workflow("bench_seq", steps)
        assert harvest.result(execution_id, timeout=60) == steps
        t1 = time.time()
        history = harvest.history(execution_id)
        marks = [
            h.recorded_at.timestamp()
            for h in history
            if isinstance(h.event, ev.WorkflowStarted | ev.ActivityCompleted)
        ]
        per["client start -> WorkflowStarted"].append(marks[0] - t0)
        for k, (a, b) in enumerate(zip(marks, marks[1:], strict=False), 1):
            per[f"step {k}"].append(b - a)
        per["last event -> result() returned"].append(t1 - history[-1].recorded_at.timestamp())
    return {k: round(statistics.median(v) * 1000, 2) for k, v in per.items()}


def _pcts(values: list[float]) -> dict[str, float]:
    """Count, median and p90 of seconds, in milliseconds (nearest rank)."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": at(0.5), "p90_ms": at(0.9)}


def thread_use(since: float, until: float) -> dict[str, Any]:
    """Where the activity threads' time went in the window ``since``..``until`` (epoch seconds),
    from the histories of the runs that closed in it (``--threads``). Per thread (an
    ``ActivityStarted.worker_id``): the share of the window inside an attempt (from its
    ``ActivityStarted`` to its ``ActivityCompleted``; an eager attempt's start is stamped by the
    write that claimed it, so back-to-back eager attempts leave no gap), and the gap before each
    delivered attempt (the thread's previous completion to this claim: the end of the previous
    task, the next message's fetch and its claim). Per run: the wait of a delivered attempt (the
    run's previous completion, or its start, to the claim) and the start to the first decision."""
    import sqlalchemy as sa

    from benchmarks.common import harvest_client

    harvest = harvest_client()
    window = (datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC))
    with harvest.store.engine.connect() as conn:
        ids = (
            conn.execute(
                sa.text("SELECT id FROM harvest_executions WHERE closed_at BETWEEN :a AND :b"),
                {"a": window[0], "b": window[1]},
            )
            .scalars()
            .all()
        )
    return analyse_threads([harvest.history(execution_id) for execution_id in ids], since, until)


def analyse_threads(histories: list[list[Any]], since: float, until: float) -> dict[str, Any]:
    """``thread_use`` on histories already read (lists of ``HistoryEvent``)."""
    from harvest_celery._core import events as ev

    attempts: dict[str, list[tuple[float, float, bool]]] = collections.defaultdict(list)
    delivered_wait: list[float] = []
    first_decision: list[float] = []
    for history in histories:
        scheduled: dict[str, float] = {}
        started: dict[str, tuple[float, str]] = {}
        previous = history[0].recorded_at.timestamp()
        first = None
        for h in history:
            e, t = h.event, h.recorded_at.timestamp()
            if isinstance(e, ev.ActivityScheduled):
                scheduled[e.activity_id] = t
                first = t if first is None else first
            elif isinstance(e, ev.ActivityStarted):
                started[e.activity_id] = (t, e.worker_id)
                if t != scheduled.get(e.activity_id):
                    delivered_wait.append(t - previous)
            elif isinstance(e, ev.ActivityCompleted) and e.activity_id in started:
                s, worker = started[e.activity_id]
                attempts[worker].append((s, t, s == scheduled.get(e.activity_id)))
                previous = t
        if first is not None:
            first_decision.append(first - history[0].recorded_at.timestamp())
    threads = {}
    for worker, spans in sorted(attempts.items()):
        spans.sort()
        lo, hi = max(since, spans[0][0]), min(until, spans[-1][1])
        inside = sum(min(b, hi) - max(a, lo) for a, b, _ in spans if b > lo and a < hi)
        gaps = [n[0] - p[1] for p, n in zip(spans, spans[1:], strict=False) if not n[2]]
        threads[worker] = {
            "attempts": len(spans),
            "in_attempt_share": round(inside / (hi - lo), 3) if hi > lo else None,
            "attempt": _pcts([b - a for a, b, _ in spans]),
            "gap_before_delivered": _pcts(gaps),
        }
    return {
        "runs": len(histories),
        "threads": threads,
        "delivered_attempt_wait": _pcts(delivered_wait),
        "start_to_first_decision": _pcts(first_decision),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    p.add_argument("--pool", choices=("threads", "prefork"), default="threads")
    p.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    p.add_argument("--topology", choices=("split", "shared"), default="split")
    p.add_argument("--inflight", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--worker-concurrency", type=int, default=4)
    p.add_argument("--py-spy", type=Path, help="record each worker with py-spy into this directory")
    p.add_argument("--b1-runs", type=int, default=0, help="also: B1 step times by position, over N runs")
    p.add_argument("--fold", type=Path, nargs="*", help="summarise py-spy raw files and exit")
    p.add_argument(
        "--threads", action="store_true", help="also: the activity threads' time, from the histories"
    )
    args = p.parse_args(argv)
    if args.fold:
        for f in args.fold:
            print(f"== {f}")
            for share, label in fold(f):
                print(f"{share:5.1f}%  {label}")
        return 0
    deployment_env(args.pool, args.broker)
    setup()
    topology = {"split": "split", "shared": "pair"}[args.topology]
    with Cluster(topology, args.worker_concurrency, "profile") as cluster:
        harvest_job(args.steps)
        raw_client_chain(args.steps)
        res = {}
        for name, job in (
            ("harvest", lambda: harvest_job(args.steps)),
            ("raw", lambda: raw_client_chain(args.steps)),
        ):
            log(f"{name}: {args.inflight} in flight for {args.seconds:.0f} s…")
            since = time.time()
            res[name] = measure(cluster, name, job, args)
            if name == "harvest" and args.threads:
                res["harvest_threads"] = thread_use(since, time.time())
        res["replays"] = cluster.replays()
        if args.b1_runs:
            res["b1_positions_ms"] = positions(args.b1_runs, args.steps)
    print(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, **res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
