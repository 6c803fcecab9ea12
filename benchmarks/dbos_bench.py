"""The DBOS side of the comparison, run as its own process by ``benchmarks.run``.

``python -m benchmarks.dbos_bench --url postgresql://... --parts sequential,throughput,history,fanout``
prints one JSON line (the last line of stdout) with one key per part:

* ``sequential`` — one warm-up, then ``--runs`` workflows of ``--steps`` sequential
  ``@DBOS.step()`` steps: per-run wall times and per-step latencies (B1);
* ``throughput`` — for each C in ``--inflight``: ``max(--min-jobs, 2C)`` such workflows, C client
  threads each running one after another: wall seconds (B2);
* ``history`` — one workflow of ``--history-steps`` steps: every step call's latency (B3);
* ``fanout`` — a workflow that starts ``--fanout-cells`` child workflows (one step each) with
  ``DBOS.start_workflow``, waits for all, then starts as many undo children and waits (B4).

A separate process because DBOS is a process-wide singleton with its own background threads and
logging; a failure here (DBOS missing, cannot connect) must not take the harness down with it.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from dbos import DBOS, DBOSConfig

_step_times: list[float] = []
_recording = threading.local()


@DBOS.step()
def dbos_step(x: int) -> int:
    return x + 1


@DBOS.step()
def dbos_undo(x: int) -> int:
    return x - 1


@DBOS.workflow()
def dbos_seq(n: int) -> int:
    x = 0
    record = getattr(_recording, "on", False)
    for _ in range(n):
        t0 = time.perf_counter()
        x = dbos_step(x)
        if record:
            _step_times.append(time.perf_counter() - t0)
    return x


@DBOS.workflow()
def dbos_cell(x: int) -> int:
    return dbos_step(x)


@DBOS.workflow()
def dbos_cell_undo(x: int) -> int:
    return dbos_undo(x)


@DBOS.workflow()
def dbos_fanout(cells: int) -> int:
    handles = [DBOS.start_workflow(dbos_cell, i) for i in range(cells)]
    outputs = [h.get_result() for h in handles]
    undo = [DBOS.start_workflow(dbos_cell_undo, x) for x in outputs]
    return sum(1 for h in undo if h.get_result() is not None)


def sequential(steps: int, runs: int) -> dict[str, Any]:
    _recording.on = True
    _step_times.clear()
    walls: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = dbos_seq(steps)
        walls.append(time.perf_counter() - t0)
        assert result == steps, result
    _recording.on = False
    return {"walls": walls, "step_latencies": list(_step_times)}


def throughput(steps: int, inflight: list[int], min_jobs: int) -> dict[str, Any]:
    rows = []
    for c in inflight:
        total = max(min_jobs, 2 * c)
        todo = iter(range(total))
        lock = threading.Lock()

        def loop() -> None:
            while True:
                with lock:  # noqa: B023 - each level's threads finish before the next level
                    if next(todo, None) is None:  # noqa: B023
                        return
                assert dbos_seq(steps) == steps

        threads = [threading.Thread(target=loop) for _ in range(c)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows.append({"inflight": c, "jobs": total, "wall_s": time.perf_counter() - t0})
    return {"rows": rows}


def history(steps: int) -> dict[str, Any]:
    _recording.on = True
    _step_times.clear()
    t0 = time.perf_counter()
    assert dbos_seq(steps) == steps
    wall = time.perf_counter() - t0
    _recording.on = False
    return {"wall_s": wall, "step_latencies": list(_step_times)}


def fanout(cells: int) -> dict[str, Any]:
    assert dbos_fanout(10) == 10  # warm-up
    t0 = time.perf_counter()
    undone = dbos_fanout(cells)
    wall = time.perf_counter() - t0
    assert undone == cells, undone
    return {"cells": cells, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--parts", default="sequential")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--inflight", default="1,4,16,64")
    parser.add_argument("--min-jobs", type=int, default=16)
    parser.add_argument("--history-steps", type=int, default=1000)
    parser.add_argument("--fanout-cells", type=int, default=1000)
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    config: DBOSConfig = {
        "name": "harvest-bench",
        "system_database_url": args.url,
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    out: dict[str, Any] = {"version": _version()}
    try:
        assert dbos_seq(args.steps) == args.steps  # warm-up: connections, schema, code paths
        for name in ("sequential", "throughput", "history", "fanout"):
            if name not in parts:
                continue
            try:
                out[name] = _part(name, args)
            except Exception as exc:  # noqa: BLE001 - one part failing keeps the others
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        DBOS.destroy()
    print(json.dumps(out))


def _part(name: str, args: argparse.Namespace) -> Any:
    if name == "sequential":
        return sequential(args.steps, args.runs)
    if name == "throughput":
        return throughput(args.steps, [int(c) for c in args.inflight.split(",")], args.min_jobs)
    if name == "history":
        return history(args.history_steps)
    return fanout(args.fanout_cells)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("dbos")
    except Exception:  # noqa: BLE001 - the version is informational
        return "?"


if __name__ == "__main__":
    main()
