"""Prometheus metrics, one row each in ``_SPECS``: a key named in ``HISTOGRAMS`` is a histogram
with those buckets, one in ``FROM_POSTGRES`` a gauge read from Postgres when scraped
(``LimitGauges``), every other key a counter. Labels are ``workflow`` (and ``outcome`` /
``queue`` where they apply); an execution id is never a label.

Counters are incremented, and histograms observed, only after the transaction that recorded
their cause commits. With tracing on, each is also handed to ``mirror`` (the OTel instruments of
``tracing.OtelMetrics``: the same names, labels and buckets); off, ``mirror`` is None. Under
Celery prefork set ``PROMETHEUS_MULTIPROC_DIR`` so every pool child's samples are aggregated;
``harvest worker --metrics-port`` serves them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("harvest_celery")

_SPECS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "saga_compensated": (
        "harvest_saga_compensated",
        "Saga/DAG unwinds begun (counted once per unwind).",
        ("workflow",),
    ),
    "saga_compensation_failed": (
        "harvest_saga_compensation_failed",
        "Unwinds that ended with compensation errors.",
        ("workflow",),
    ),
    "workflow_terminal": (
        "harvest_workflow_terminal",
        "Runs that reached a terminal outcome.",
        ("workflow", "outcome"),
    ),
    "cancel_branch_failed": (
        "harvest_cancel_branch_failed",
        "Cancelled runs whose cancel branch failed (the workflow raised an error other than Cancelled after the cancel): dangling state.",
        ("workflow",),
    ),
    "nd_blocked": (
        "harvest_nd_blocked",
        "Decisions that diverged from history (run nd-blocked).",
        ("workflow",),
    ),
    "activity_attempt_failed": (
        "harvest_activity_attempt_failed",
        "Activity attempts that failed (raised, or lost their lease).",
        ("workflow", "queue"),
    ),
    "activity_eager": (
        "harvest_activity_eager",
        "Activity attempts run eagerly in the worker that scheduled them (no broker hop).",
        ("queue",),
    ),
    "outcome_lost": (
        "harvest_outcome_lost",
        "Activity outcomes given up after the database did not answer for Timings.outcome_retry_for (the attempt is retried when its lease expires).",
        ("queue",),
    ),
    "decisions": (
        "harvest_decisions",
        "Decisions taken, by path: one_statement (with the completion, in one guarded statement), inline (in the transaction of the worker that recorded the completion) or task (the decision task).",
        ("workflow", "path"),
    ),
    "schedule_ticks": (
        "harvest_schedule_ticks",
        "Schedule ticks by outcome: fired, skipped (the overlap policy, or paused) or missed (older than the catch-up window), counted by the process that judged them (docs/schedules.md).",
        ("workflow", "outcome"),
    ),
    "decision_replays": (
        "harvest_decision_replays",
        "Decisions by how their replay began: warm (advanced from this process's cached session with the new events only) or cold (the whole history replayed); warm / (warm + cold) is the warm-session hit rate.",
        ("replay",),
    ),
    "decision_fallbacks": (
        "harvest_decision_fallbacks",
        "Completions that configuration and dialect allowed on the one-statement path but that went another way, and inline decisions handed to the decision task, by the first reason (docs/operations.md).",
        ("reason",),
    ),
    "activity_completed": (
        "harvest_activity_completed",
        "Activity attempts whose completion was recorded (ActivityCompleted appended): the steps a run took, compensations included.",
        ("workflow", "queue"),
    ),
    "limit_in_use": (
        "harvest_limit_in_use",
        "Slots of the activity's concurrency limit in use, summed over its keys (read from Postgres when scraped; docs/flow-control.md).",
        ("limit",),
    ),
    "limit_waiting": (
        "harvest_limit_waiting",
        "Activity task rows held back (status waiting) for a slot of the limit, summed over its keys (read from Postgres when scraped).",
        ("limit",),
    ),
    "limit_throttled": (
        "harvest_limit_throttled_seconds",
        "Seconds that activity task rows released under a rate limit spent waiting, counted for each row the rate held back at least once (denied a token), summed over its keys; counted when the release commits (docs/flow-control.md).",
        ("limit",),
    ),
    "admission_waiting": (
        "harvest_admission_waiting",
        "Runs of the limited workflow waiting for admission (RUNNING, not admitted), summed over its keys (read from Postgres when scraped; docs/flow-control.md).",
        ("workflow",),
    ),
    "admission_in_use": (
        "harvest_admission_in_use",
        "Admitted runs of the limited workflow holding a slot of its concurrency limit, summed over its keys (read from Postgres when scraped).",
        ("workflow",),
    ),
    "activity_schedule_to_start": (
        "harvest_activity_schedule_to_start_seconds",
        "Seconds from an activity's ActivityScheduled to its first attempt's ActivityStarted (recorded times): queueing, broker hop and any wait for a concurrency slot. Observed when the claim has committed; later attempts are not observed (their start waits on the retry backoff).",
        ("queue",),
    ),
}
# the keys of _SPECS that are histograms, with their buckets (seconds)
_LAG_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
HISTOGRAMS: dict[str, tuple[float, ...]] = {"activity_schedule_to_start": _LAG_BUCKETS}
# the keys of _SPECS that are gauges read from Postgres when scraped (``LimitGauges``), with the
# field each reports: of ``Harvest.limits()`` (activity limits), or of the admission rows
# (``_store.admission.gauges``: workflow admission)
FROM_POSTGRES: dict[str, str] = {
    "limit_in_use": "in_use",
    "limit_waiting": "waiting",
    "admission_waiting": "waiting",
    "admission_in_use": "in_use",
}
_ADMISSION = ("admission_waiting", "admission_in_use")
# the exposition's sample names per kind (the suffixes prometheus_client adds)
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


class LimitGauges(Collector):
    """``harvest_limit_in_use`` and ``harvest_limit_waiting``, one sample per limited activity
    (no key label: a key is payload), read through ``source`` (the process's store,
    ``Runtime`` sets it) each time the exposition is collected. No source, or a database that
    does not answer: the gauges have no samples (logged), and the scrape still answers."""

    def __init__(self) -> None:
        self.source: Callable[[], list[dict[str, Any]]] | None = None
        # ``harvest_admission_*``: one row per limited workflow ({name, waiting, in_use})
        self.admissions: Callable[[], list[dict[str, Any]]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = _read(self.source, "harvest_limit_*", "the limits")
        admitted = _read(self.admissions, "harvest_admission_*", "the admissions")
        for key, field in FROM_POSTGRES.items():
            name, doc, labels = _SPECS[key]
            family = GaugeMetricFamily(name, doc, labels=labels)
            for row in admitted if key in _ADMISSION else rows:
                family.add_metric([str(row["name"])], float(row[field]))
            yield family


def _read(source: Callable[[], list[dict[str, Any]]] | None, gauges: str, what: str) -> list[dict[str, Any]]:
    if source is None:
        return []
    try:
        return source()
    except Exception as exc:  # noqa: BLE001 - the other metrics are still worth a scrape
        log.warning("%s gauges: cannot read %s (%s)", gauges, what, type(exc).__name__)
        return []


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[str, Counter] = {
            key: Counter(name, doc, labels)
            for key, (name, doc, labels) in _SPECS.items()
            if key not in HISTOGRAMS and key not in FROM_POSTGRES
        }
        self.histograms: dict[str, Histogram] = {
            key: Histogram(_SPECS[key][0], _SPECS[key][1], _SPECS[key][2], buckets=buckets)
            for key, buckets in HISTOGRAMS.items()
        }
        self.limits = LimitGauges()
        REGISTRY.register(self.limits)
        self.mirror: Any = None  # tracing on: OTel metrics (``tracing.OtelMetrics``)

    def inc(self, key: str, labels: dict[str, str], amount: float = 1.0) -> None:
        counter = self.counters.get(key)
        if counter is None:
            return
        names = _SPECS[key][2]
        values = {n: labels.get(n, "") for n in names}
        counter.labels(**values).inc(amount)
        if self.mirror is not None:
            self.mirror.add(key, values, amount)

    def observe(self, key: str, labels: dict[str, str], value: float) -> None:
        histogram = self.histograms.get(key)
        if histogram is None:
            return
        names = _SPECS[key][2]
        values = {n: labels.get(n, "") for n in names}
        histogram.labels(**values).observe(value)
        if self.mirror is not None:
            self.mirror.record(key, values, value)

    def exported_names(self) -> set[str]:
        """Every sample name this registry's metrics export (``harvest_x_total``,
        ``harvest_y_bucket``/``_sum``/``_count``), read from what the collectors collect."""
        out: set[str] = set()
        for collector in (*self.counters.values(), *self.histograms.values(), self.limits):
            for family in collector.collect():
                out.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        return out

    def value(self, key: str, labels: dict[str, str]) -> float:
        """This process's current value (tests and the demo)."""
        names = _SPECS[key][2]
        sample = self.counters[key].labels(**{n: labels.get(n, "") for n in names})
        return float(sample._value.get())


METRICS = Metrics()


def specs() -> Iterator[tuple[str, str, str, str]]:
    """Every metric as (key, name, help, kind): ``counter``, ``histogram`` (its buckets in
    ``HISTOGRAMS``) or ``gauge`` (read from Postgres: ``limit_rows``)."""
    for key, (name, doc, _labels) in _SPECS.items():
        kind = "histogram" if key in HISTOGRAMS else "gauge" if key in FROM_POSTGRES else "counter"
        yield key, name, doc, kind


def limit_rows(key: str) -> list[tuple[dict[str, str], float]]:
    """A Postgres-read gauge's samples now, as (labels, value) (``LimitGauges``' read)."""
    name = _SPECS[key][0]
    return [
        (dict(sample.labels), float(sample.value))
        for family in METRICS.limits.collect()
        if family.name == name
        for sample in family.samples
    ]


def _registry() -> Any:
    """What a scrape collects: this process's registry, or under PROMETHEUS_MULTIPROC_DIR every
    process's samples aggregated — plus the gauges read from Postgres (once, by this process)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(METRICS.limits)
    return registry


def exposition() -> tuple[bytes, str]:
    """The text exposition: aggregated over processes when PROMETHEUS_MULTIPROC_DIR is set."""
    return generate_latest(_registry()), CONTENT_TYPE_LATEST


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` from this process (aggregating pool children under
    PROMETHEUS_MULTIPROC_DIR)."""
    start_http_server(port, addr=addr, registry=_registry())
