"""OpenTelemetry tracing (docs/observability.md, "Tracing"): the one module that imports
opentelemetry. ``Harvest`` imports it only when tracing is on (``tracing=True``,
``HARVEST_TRACING=1``; ``scripts/shape.py`` lists it in ``OPTIONAL_LAZY``), so tracing off loads
no opentelemetry module and pays one ``is None`` check per site.

The span model, one trace per run:

* ``harvest.start`` — a child of the caller's current span (the web request);
* the run span, ``harvest.run <workflow>`` — its id pre-allocated at start and stored as the
  run's W3C ``traceparent`` (written by the start's own statement); emitted at close by the
  process that commits the close, with the run's ``created_at`` and ``closed_at`` as its times.
  Its parent is the start span, whose id is the run span's XOR ``_START_MASK``: the one stored
  traceparent names both;
* ``harvest.decision <path>`` — one per live decision, named by its completion path;
* ``harvest.activity <name>`` / ``harvest.compensation <name>`` — one per attempt, from the
  body's start to its outcome's commit; a child of Celery's task span when the instrumentation
  has one current in the same trace, otherwise of the run span.

Decision and attempt spans take the run span as parent, rebuilt from the stored context, never
the previous step's: the tree's depth does not grow with the number of steps. Every span leaves
only after the commit of what it describes (``Tx.spans``, ``Tx.closed_runs``, read by
``Runtime._after_commit``; an attempt's after its outcome's commit), never from a replay, a
probe or a query. No span holds an input, output, signal payload or marker detail: exception
text follows ``celery_error_detail`` through ``outcomes.for_celery``, as Celery's view does, and a
database error in its chain is redacted as harvest's log filter does (``_store.redaction``).

With tracing on, harvest's Prometheus metrics are also recorded as OpenTelemetry metrics
(``OtelMetrics``: the same names, labels and histogram buckets, on the global meter provider
or ``Tracing.metrics.provider``); Prometheus is unchanged.

The SDK's id generator cannot be asked for a given id, so every harvest span is built here,
finished (``ReadableSpan``), and handed to the SDK provider's span processors: this module is the
only code that touches SDK types. A provider that is not the SDK's (none set) gets nothing.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from harvest_celery._runtime import metrics
from harvest_celery._runtime.messages import activity_task_id
from harvest_celery._runtime.outcomes import for_celery
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._store import starts
from harvest_celery._store.records import Claim, RunRow
from harvest_celery._store.redaction import redacted
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")
SCOPE = InstrumentationScope("harvest_celery")
_START_MASK = 0x5A17_C0DE_0B5E_7F01  # start span id = run span id XOR this (never 0: re-drawn)
_FAILED = ("FAILED", "TIMED_OUT", "TERMINATED")
_MAX_EVENTS = 128  # the SDK's default limit of events per span
_KNOWN_MAX = 10_000  # runs whose context this process remembers (a stored context never changes)


def traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(text: str | None) -> SpanContext | None:
    """A stored W3C traceparent as a (remote) span context; None if absent or malformed."""
    parts = (text or "").split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        ctx = SpanContext(int(parts[1], 16), int(parts[2], 16), True, TraceFlags(int(parts[3], 16)))
    except ValueError:
        return None
    return ctx if ctx.is_valid else None


def start_span_of(run: SpanContext) -> SpanContext:
    """The start span's context, derived from the run span's (the run span's parent)."""
    return SpanContext(run.trace_id, run.span_id ^ _START_MASK, False, run.trace_flags)


@dataclass(frozen=True)
class StartTrace:
    """A start in progress: its parent (the caller's span), the run span pre-allocated for it."""

    workflow: str
    parent: SpanContext | None
    run: SpanContext
    started_ns: int

    @property
    def traceparent(self) -> str:
        return traceparent(self.run)


@dataclass(frozen=True)
class DecisionRecord:
    """A live decision, as its transaction records it (plain data until the commit).
    ``read``: the decision locked the run's row, so ``stored`` is its stored traceparent (the
    row's own column: no read of its own); else (the one-statement path) it is looked up."""

    execution_id: str
    workflow: str
    path: str
    started_ns: int
    read: bool = False
    stored: str | None = None


@dataclass(frozen=True)
class TickRecord:
    """A schedule tick's start, pre-allocated in its transaction: its span once committed, if
    the start made the run (an existing run keeps its own context)."""

    execution_id: str
    start: StartTrace


@dataclass(frozen=True)
class RunContext:
    span: SpanContext
    workflow: str


def _ns(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1_000_000_000)


class Tracing:
    """The runtime's tracer (``runtime.Tracer``). ``provider``: the SDK provider to emit to
    (default: the global one, read at each emission, so an application may set it later)."""

    def __init__(self, runtime: Runtime, provider: TracerProvider | None = None) -> None:
        self.runtime = runtime
        self.provider = provider
        self._ids = RandomIdGenerator()
        self._known: OrderedDict[str, RunContext | None] = OrderedDict()  # None: not traced
        self.metrics: OtelMetrics | None = None  # the process's OTel metrics (``load``)
        self._lock = threading.Lock()

    # ── emission ─────────────────────────────────────────────────────────────────────────────
    def _sdk(self) -> TracerProvider | None:
        provider = self.provider if self.provider is not None else trace.get_tracer_provider()
        return provider if isinstance(provider, TracerProvider) else None

    def _emit(
        self,
        name: str,
        ctx: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any],
        *,
        status: Status | None = None,
        events: tuple[Event, ...] = (),
        links: tuple[Link, ...] = (),
    ) -> None:
        provider = self._sdk()
        if provider is None or not ctx.trace_flags.sampled:
            return
        span = ReadableSpan(
            name,
            context=ctx,
            parent=parent,
            resource=provider.resource,
            attributes=dict(attributes),
            events=events,
            links=links,
            kind=SpanKind.INTERNAL,
            status=status or Status(StatusCode.UNSET),
            start_time=start_ns,
            end_time=max(end_ns, start_ns),
            instrumentation_scope=SCOPE,
        )
        try:
            provider._active_span_processor.on_end(span)  # the processors the application set up
        except Exception:  # noqa: BLE001 - an exporter's failure never fails a step
            log.warning("tracing: span %s was not exported", name, exc_info=True)

    def _child(self, parent: SpanContext) -> SpanContext:
        return SpanContext(parent.trace_id, self._ids.generate_span_id(), False, parent.trace_flags)

    # ── the run's stored context ─────────────────────────────────────────────────────────────
    def _remember(self, execution_id: str, run: RunContext | None) -> None:
        with self._lock:
            self._known[execution_id] = run
            self._known.move_to_end(execution_id)
            while len(self._known) > _KNOWN_MAX:
                self._known.popitem(last=False)

    def run_of(self, execution_id: str) -> RunContext | None:
        """The run span's context, rebuilt from the stored traceparent (remembered per run).
        A read that fails is logged and traces nothing: tracing never fails a step."""
        try:
            return self._run_of(execution_id)
        except Exception as exc:  # noqa: BLE001 - the step goes on untraced
            log.warning("tracing: cannot read the trace context of %s: %s", execution_id, type(exc).__name__)
            return None

    def _run_of(self, execution_id: str) -> RunContext | None:
        with self._lock:
            if execution_id in self._known:
                return self._known[execution_id]
        found = self._read(starts.trace_context, execution_id)  # one statement: autocommit
        if found is None:
            return None  # not (or no longer) a run: asked again next time
        return self._stored(execution_id, found.workflow_type, found.traceparent)

    def _stored(self, execution_id: str, workflow: str, stored: str | None) -> RunContext | None:
        """The run's context from its stored traceparent, remembered (one a run started with
        tracing off is None: its steps are not traced, and it is remembered as such)."""
        span = parse_traceparent(stored)
        run = RunContext(span, workflow) if span is not None else None
        self._remember(execution_id, run)
        return run

    def _read(self, query: Any, *args: Any) -> Any:
        """One read-only statement of ``_store``, in its own autocommit transaction (one round
        trip on Postgres: no BEGIN, no COMMIT)."""
        found, _tx = self.runtime.store.transaction(lambda tx: query(tx, *args), one_statement=True)
        return found

    @contextmanager
    def run_context(self, execution_id: str) -> Iterator[None]:
        """The run span current while a message is sent (Celery's publish span hangs off it)."""
        run = self.run_of(execution_id)
        if run is None:
            yield
            return
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(run.span)))
        try:
            yield
        finally:
            otel_context.detach(token)

    # ── harvest.start ────────────────────────────────────────────────────────────────────────
    def begin_start(self, workflow: str) -> StartTrace:
        """Before the start's statement: the run span's id, in the caller's trace (or a new one)."""
        parent = trace.get_current_span().get_span_context()
        if parent.is_valid:
            trace_id, flags = parent.trace_id, parent.trace_flags
        else:
            trace_id, flags = self._ids.generate_trace_id(), TraceFlags(TraceFlags.SAMPLED)
        span_id = self._ids.generate_span_id()
        while span_id ^ _START_MASK == 0:
            span_id = self._ids.generate_span_id()
        run = SpanContext(trace_id, span_id, False, flags)
        return StartTrace(workflow, parent if parent.is_valid else None, run, time.time_ns())

    def started(self, start: StartTrace, execution_id: str, created: bool) -> None:
        """After the start committed: its span. A start answered by an existing run (idempotent)
        is a span of its own; the first start's stored context stays the run's."""
        if created:
            self._remember(execution_id, RunContext(start.run, start.workflow))
        attributes = {
            "harvest.execution_id": execution_id,
            "harvest.workflow": start.workflow,
            "harvest.created": created,
        }
        ctx = start_span_of(start.run) if created else self._child(start.run)
        self._emit("harvest.start", ctx, start.parent, start.started_ns, time.time_ns(), attributes)

    def tick_start(self, tx: Tx, execution_id: str, workflow: str) -> str:
        """A schedule tick's start (``Tx.trace_start``): a new trace, whatever span is current."""
        token = otel_context.attach(otel_context.Context())
        try:
            start = self.begin_start(workflow)
        finally:
            otel_context.detach(token)
        tx.spans.append(TickRecord(execution_id, start))
        return start.traceparent

    # ── after a commit ───────────────────────────────────────────────────────────────────────
    def decision(
        self, execution_id: str, workflow: str, path: str, started_ns: int, row: RunRow | None = None
    ) -> DecisionRecord:
        """A live decision's record; ``row``: the run's row as the decision locked it."""
        if row is None:
            return DecisionRecord(execution_id, workflow, path, started_ns)
        return DecisionRecord(execution_id, workflow, path, started_ns, True, row.traceparent)

    def after_commit(self, tx: Tx) -> None:
        """What a committed transaction did: its decisions' spans, then its closed runs'."""
        try:
            for record in tx.spans:
                if isinstance(record, DecisionRecord):
                    self._decision_span(record)
                elif isinstance(record, TickRecord):
                    run = self.run_of(record.execution_id)
                    made = run is not None and run.span.span_id == record.start.run.span_id
                    if made:
                        self.started(record.start, record.execution_id, True)
            for execution_id in dict.fromkeys(tx.closed_runs):  # once, however often it was written
                self._run_span(execution_id)
        except Exception:  # noqa: BLE001 - what committed is acted on all the same (sends)
            log.warning("tracing: spans of a committed transaction were lost", exc_info=True)

    def _decision_span(self, record: DecisionRecord) -> None:
        run = self._context_of(record)
        if run is None:
            return
        attributes = {
            "harvest.execution_id": record.execution_id,
            "harvest.workflow": record.workflow,
            "harvest.path": record.path,
        }
        name = f"harvest.decision {record.path}"
        self._emit(name, self._child(run.span), run.span, record.started_ns, time.time_ns(), attributes)

    def _context_of(self, record: DecisionRecord) -> RunContext | None:
        """A decision's run context: remembered, else from the row it locked (committed now),
        else read (``run_of``). A stored context never changes, so the row's is the run's."""
        if not record.read:
            return self.run_of(record.execution_id)
        with self._lock:
            if record.execution_id in self._known:
                return self._known[record.execution_id]
        return self._stored(record.execution_id, record.workflow, record.stored)

    def _run_span(self, execution_id: str) -> None:
        # a closed run changes no more: each read is a statement of its own (autocommit)
        found = self._read(starts.trace_context, execution_id)
        run = parse_traceparent(found.traceparent if found is not None else None)
        if found is None or run is None:
            return
        waits = _waits(self._read(starts.wait_events, execution_id, _MAX_EVENTS))
        chained = found.continued_from is not None
        root = parse_traceparent(
            self._read(starts.chain_root_traceparent, found.continued_from) if chained else None
        )
        parent, links = self._run_parent(run, found, root)
        created, closed = _ns(found.created_at), _ns(found.closed_at) or time.time_ns()
        run = SpanContext(run.trace_id, run.span_id, False, run.trace_flags)
        failed = found.status in _FAILED
        self._emit(
            f"harvest.run {found.workflow_type}",
            run,
            parent,
            created or closed,
            closed,
            {
                "harvest.execution_id": execution_id,
                "harvest.workflow": found.workflow_type,
                "harvest.status": found.status,
            },
            status=Status(StatusCode.ERROR, found.status) if failed else None,
            events=waits,
            links=links,
        )

    def _run_parent(
        self, run: SpanContext, found: Any, root: SpanContext | None
    ) -> tuple[SpanContext | None, tuple[Link, ...]]:
        """A run span's parent and links: its start span; a child's, the parent's run span (the
        child's context was inherited from it: ``starts.inherited_traceparent``); a continued
        run's, the chain's start span, with a link to the run it continues; a fork's, none (a
        trace of its own), with a link to its source's run span."""
        if found.forked_from is not None:
            source = self.run_of(found.forked_from)
            return None, (Link(source.span),) if source is not None else ()
        if found.continued_from is not None:
            previous = self.run_of(found.continued_from)
            links = (Link(previous.span),) if previous is not None else ()
            if root is not None and root.trace_id == run.trace_id:
                return start_span_of(root), links
            return start_span_of(run), links
        if found.parent_id is not None:
            parent = self.run_of(found.parent_id)
            if parent is not None and parent.span.trace_id == run.trace_id:
                return parent.span, ()
        return start_span_of(run), ()

    # ── attempts ─────────────────────────────────────────────────────────────────────────────
    def attempt(self, claim: Claim, started_ns: int, outcome: str, error: BaseException | None) -> None:
        """An attempt's span, once its outcome committed: a child of the instrumentation's task
        span when one is current in the run's trace, else of the run span. Never raises: the
        outcome is committed, only its span can be lost."""
        try:
            self._attempt(claim, started_ns, outcome, error)
        except Exception:  # noqa: BLE001 - the outcome is committed; only its span is lost
            log.warning("tracing: the span of attempt %s/%s was lost", claim.execution_id, claim.activity_id)

    def _attempt(self, claim: Claim, started_ns: int, outcome: str, error: BaseException | None) -> None:
        run = self.run_of(claim.execution_id)
        if run is None:
            return
        parent = _task_span(run.span) or run.span
        kind = "compensation" if claim.compensation else "activity"
        attributes = {
            "harvest.execution_id": claim.execution_id,
            "harvest.workflow": run.workflow,
            "harvest.activity": claim.activity_name,
            "harvest.activity_id": claim.activity_id,
            "harvest.attempt": claim.attempt,
            "harvest.queue": claim.queue,
            "harvest.outcome": outcome,
        }
        status: Status | None = None
        events: tuple[Event, ...] = ()
        if error is not None:
            status, events = self._failure(claim, error)
        name = f"harvest.{kind} {claim.activity_name}"
        self._emit(
            name,
            self._child(parent),
            parent,
            started_ns,
            time.time_ns(),
            attributes,
            status=status,
            events=events,
        )

    def _failure(self, claim: Claim, error: BaseException) -> tuple[Status, tuple[Event, ...]]:
        """The status and exception event of a failed attempt, with the text Celery is shown
        (``for_celery``: under ``celery_error_detail="type"`` only the type leaves harvest)."""
        task_id = activity_task_id(claim.execution_id, claim.activity_id, claim.attempt)
        shown = for_celery(self.runtime, error, task_id)
        error_type = type(error).__qualname__
        attributes: dict[str, Any] = {"exception.type": error_type}
        text = redacted(shown)  # a Postgres error in the chain: its primary message, as in the logs
        if shown is error:
            attributes["exception.message"] = str(text)
            if text is error:
                attributes["exception.stacktrace"] = "".join(traceback.format_exception(error))
            description = f"{error_type}: {text}"
        else:
            description = error_type
        return Status(StatusCode.ERROR, description), (Event("exception", attributes, time.time_ns()),)


def _waits(rows: Sequence[Any]) -> tuple[Event, ...]:
    """The run's timer and signal waits as events, at their recorded times: ids, durations and
    signal names only, never a payload (``starts.wait_events``: the first ``_MAX_EVENTS``, and
    only those fields are read)."""
    out: list[Event] = []
    for row in rows:
        kind, when = row.type, _ns(row.recorded_at)
        if kind == "TimerStarted":
            attributes = {"harvest.timer_id": str(row.timer_id), "harvest.seconds": row.seconds}
            out.append(Event("harvest.timer_started", attributes, when))
        elif kind == "TimerFired":
            out.append(Event("harvest.timer_fired", {"harvest.timer_id": str(row.timer_id)}, when))
        elif kind == "SignalReceived":
            out.append(Event("harvest.signal", {"harvest.signal": str(row.name)}, when))
    return tuple(out)


def _task_span(run: SpanContext) -> SpanContext | None:
    """The instrumentation's task span, when one is current in the run's trace (a consumer span:
    a web request's span around an embedded-mode step is not one)."""
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid and ctx.trace_id == run.trace_id and getattr(span, "kind", None) is SpanKind.CONSUMER:
        return ctx
    return None


class OtelMetrics:
    """harvest's metrics as OTel instruments (``metrics.METRICS.mirror``): a counter per
    Prometheus counter (``harvest_decisions`` and so on: an OTel exporter to Prometheus adds
    ``_total``), the schedule-to-start histogram with its buckets (unit ``s``), and the limit
    gauges as observable gauges read from Postgres at each collection. ``provider``: the meter
    provider (default: the global one; the instruments are made at first use, and again if
    ``provider`` is changed). Recording never raises."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider
        self._built: tuple[Any, dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._warned = False

    def _instruments(self) -> dict[str, Any]:
        provider = self.provider if self.provider is not None else otel_metrics.get_meter_provider()
        built = self._built
        if built is not None and built[0] is provider:
            return built[1]
        with self._lock:
            meter = provider.get_meter("harvest_celery")
            out: dict[str, Any] = {}
            for key, name, doc, kind in metrics.specs():
                if kind == "histogram":
                    bounds = list(metrics.HISTOGRAMS[key])
                    out[key] = meter.create_histogram(
                        name, unit="s", description=doc, explicit_bucket_boundaries_advisory=bounds
                    )
                elif kind == "gauge":
                    out[key] = meter.create_observable_gauge(name, [_gauge_callback(key)], description=doc)
                else:
                    out[key] = meter.create_counter(name, description=doc)
            self._built = (provider, out)
            return out

    def add(self, key: str, labels: dict[str, str], amount: float = 1.0) -> None:
        try:
            self._instruments()[key].add(amount, labels)
        except Exception:  # noqa: BLE001 - Prometheus has it; only the OTel sample is lost
            self._lost(key)

    def record(self, key: str, labels: dict[str, str], value: float) -> None:
        try:
            self._instruments()[key].record(value, labels)
        except Exception:  # noqa: BLE001 - as add
            self._lost(key)

    def _lost(self, key: str) -> None:
        if not self._warned:  # once per process: a broken meter would log at every step
            self._warned = True
            log.warning("tracing: OTel metric %s was not recorded", key, exc_info=True)


def _gauge_callback(key: str) -> Any:
    def observe(_options: Any) -> Iterator[otel_metrics.Observation]:
        for labels, value in metrics.limit_rows(key):
            yield otel_metrics.Observation(value, labels)

    return observe


def load(runtime: Runtime, provider: TracerProvider | None = None) -> Tracing:
    """Turn tracing on for ``runtime``, and the OTel copy of the metrics for this process."""
    tracing = Tracing(runtime, provider)
    runtime.tracer = tracing
    if metrics.METRICS.mirror is None:
        metrics.METRICS.mirror = OtelMetrics()
    tracing.metrics = metrics.METRICS.mirror
    return tracing
