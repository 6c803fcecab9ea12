"""B1 with tracing on against tracing off, in one run, side by side (docs/performance.md,
"Tracing"): per topology, a segment of workers with tracing off, then one with tracing on
(``HARVEST_BENCH_TRACING=1``: ``Harvest(tracing=True)``, every span kept by the SDK's in-memory
exporter), each measured as B1 is (``sequential.measure``: harvest interleaved with raw Celery,
which is never traced). The client starts its runs with tracing on in the "on" segment too (a run
started with tracing off is not traced). Neither side has ``opentelemetry-instrumentation-celery``
on: the figure is harvest's own tracing. ``on_over_off``: the two segments' medians;
``on_over_off_against_raw``: the same with each segment first divided by its interleaved raw
Celery (the median of its rounds), which cancels drift between the consecutive segments. Nothing
here is a test: no timed assertions."""

from __future__ import annotations

import os
from typing import Any

from benchmarks.common import TOPOLOGY_LABELS, Cluster, harvest_client, log, ratio
from benchmarks.scenarios import sequential

TOPOLOGIES = ("single", "split")


def _client_tracing(on: bool) -> Any:
    """The client's tracing switched on (with an in-memory exporter) or off; the exporter."""
    from harvest_celery._runtime import metrics

    harvest = harvest_client()
    if not on:
        harvest.tracing = harvest.runtime.tracer = None
        metrics.METRICS.mirror = None
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from harvest_celery._runtime import tracing

    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    harvest.tracing = tracing.load(harvest.runtime, provider)
    return exporter


def segment(name: str, args: Any, on: bool) -> dict[str, Any]:
    os.environ["HARVEST_BENCH_TRACING"] = "1" if on else ""  # the workers read it at import
    exporter = _client_tracing(on)
    try:
        with Cluster(name, args.worker_concurrency, f"tr-{name}-{'on' if on else 'off'}") as cluster:
            out = sequential.measure(args.steps, args.runs)
            spans = [s.get("spans") for s in cluster.stats().values()]
    finally:
        os.environ.pop("HARVEST_BENCH_TRACING", None)
        _client_tracing(False)
    out.pop("harvest_steps_total")
    out["worker_spans"] = sum(s or 0 for s in spans) if on else None
    out["client_spans"] = len(exporter.get_finished_spans()) if exporter is not None else None
    return out


def run(args: Any, _dbos: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {"steps": args.steps, "runs": args.runs, "topologies": {}}
    for name in TOPOLOGIES:
        t: dict[str, Any] = {"label": TOPOLOGY_LABELS[name]}
        for mode in ("off", "on"):
            log(f"tracing {mode}: B1, topology {name} ({TOPOLOGY_LABELS[name]})…")
            t[mode] = segment(name, args, mode == "on")
        off, on = (t[m]["harvest"]["per_step"]["median_ms"] for m in ("off", "on"))
        raw_off, raw_on = (
            t[m]["raw_celery"]["client_waited"]["per_step"]["median_ms"] for m in ("off", "on")
        )
        t["ratios"] = {
            "on_over_off": ratio(on, off),
            "off_harvest_over_raw_celery": ratio(off, raw_off),
            "on_harvest_over_raw_celery": ratio(on, raw_on),
            "rounds_off_over_raw_celery": t["off"].pop("rounds_harvest_over_raw_celery"),
            "rounds_on_over_raw_celery": t["on"].pop("rounds_harvest_over_raw_celery"),
        }
        rounds = t["ratios"]
        # the segments are consecutive: on÷off also holds the machine's drift between them, which
        # each segment's interleaved raw Celery shares; this one divides it out
        t["ratios"]["on_over_off_against_raw"] = ratio(
            rounds["rounds_on_over_raw_celery"]["median"], rounds["rounds_off_over_raw_celery"]["median"]
        )
        res["topologies"][name] = t
    return res
