"""B5 — a Celery canvas made durable: ``chord(group(canvas_step.s(i) for i in range(N)),
canvas_sum.s())`` (N = 1,000 by default) started with ``harvest.start_canvas`` and waited on with
``harvest.result``, against the **same** chord under plain Celery (``apply_async().get()``, the
Redis result backend's chord counter, no ``chord_unlock``), on the same tasks, the same Redis and
the same workers (documented deployment: decision + activity worker), interleaved ``--repeats``
times. Both must return the same sum. The canvas is compiled once, at start: the start's own
time (compile + one transaction) is reported apart."""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.common import TOPOLOGY_LABELS, Cluster, harvest_client, log, ratio

TOPOLOGY = "split"


def make(cells: int) -> Any:
    from celery import chord

    from benchmarks.app import canvas_step, canvas_sum

    return chord([canvas_step.s(i) for i in range(cells)], canvas_sum.s())


def expected(cells: int) -> int:
    return sum(i + 1 for i in range(cells))


def harvest_chord(cells: int, timeout: float) -> dict[str, float]:
    harvest = harvest_client()
    sig = make(cells)
    t0 = time.perf_counter()
    run_id = harvest.start_canvas(sig)
    started = time.perf_counter()
    result = harvest.result(run_id, timeout=timeout)
    wall = time.perf_counter() - t0
    assert result == expected(cells), result
    return {"wall_s": wall, "start_s": started - t0}


def raw_chord(cells: int, timeout: float) -> float:
    sig = make(cells)
    t0 = time.perf_counter()
    result = sig.apply_async().get(timeout=timeout)
    wall = time.perf_counter() - t0
    assert result == expected(cells), result
    return wall


def run(args: Any, _dbos: dict[str, Any]) -> dict[str, Any]:
    cells, repeats = args.canvas_cells, args.repeats
    timeout = 120 + cells * 0.5
    log(f"B5 canvas: a chord of {cells} header tasks + body, durable vs plain Celery, {repeats} repeats…")
    samples: dict[str, list[float]] = {"harvest": [], "harvest_start": [], "raw": []}
    with Cluster(TOPOLOGY, args.worker_concurrency, "b5"):
        harvest_chord(10, 120)  # warm-up (code paths, connections)
        raw_chord(10, 120)
        for i in range(repeats):
            # the order alternates, so drift hits both systems alike
            order = ("harvest", "raw") if i % 2 == 0 else ("raw", "harvest")
            for system in order:
                if system == "harvest":
                    h = harvest_chord(cells, timeout)
                    samples["harvest"].append(h["wall_s"])
                    samples["harvest_start"].append(h["start_s"])
                else:
                    samples["raw"].append(raw_chord(cells, timeout))
    per_repeat = [ratio(h, r) for h, r in zip(samples["harvest"], samples["raw"], strict=True)]
    harvest_s, raw_s = statistics.median(samples["harvest"]), statistics.median(samples["raw"])
    return {
        "cells": cells,
        "repeats": repeats,
        "topology": TOPOLOGY_LABELS[TOPOLOGY],
        "harvest": {"wall_s": harvest_s, "start_s": statistics.median(samples["harvest_start"])},
        "raw_celery": {"wall_s": raw_s},
        "samples": samples,
        "ratios": {
            "harvest_over_raw": ratio(harvest_s, raw_s),
            "per_repeat": {
                "median": statistics.median(per_repeat),
                "min": min(per_repeat),
                "max": max(per_repeat),
            },
        },
    }
