"""The DBOS side of the comparison, run as its own process by ``benchmarks.run``.

``python -m benchmarks.dbos_bench --steps 20 --runs 10 --url postgresql://...`` runs one warm-up
workflow, then ``--runs`` workflows of ``--steps`` sequential ``@DBOS.step()`` steps, and prints
one JSON line (the last line of stdout) with the per-run wall times and per-step latencies.

A separate process because DBOS is a process-wide singleton with its own background threads and
logging; a failure here (DBOS missing, cannot connect) must not take the harness down with it.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from dbos import DBOS, DBOSConfig

_step_times: list[float] = []


@DBOS.step()
def dbos_step(x: int) -> int:
    return x + 1


@DBOS.workflow()
def dbos_seq(n: int) -> int:
    x = 0
    for _ in range(n):
        t0 = time.perf_counter()
        x = dbos_step(x)
        _step_times.append(time.perf_counter() - t0)
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--url", required=True)
    args = parser.parse_args()

    config: DBOSConfig = {
        "name": "harvest-bench",
        "system_database_url": args.url,
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        assert dbos_seq(args.steps) == args.steps  # warm-up: connections, schema, code paths
        _step_times.clear()
        walls: list[float] = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            result = dbos_seq(args.steps)
            walls.append(time.perf_counter() - t0)
            assert result == args.steps, result
        out: dict[str, Any] = {"walls": walls, "step_latencies": list(_step_times),
                               "version": _version()}
    finally:
        DBOS.destroy()
    print(json.dumps(out))


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("dbos")
    except Exception:  # noqa: BLE001 - the version is informational
        return "?"


if __name__ == "__main__":
    main()
