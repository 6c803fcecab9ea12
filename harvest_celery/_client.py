"""``Harvest``: the one object a Django/Flask app, the CLI and the API use."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from types import ModuleType
from typing import Any, Literal

from harvest_celery._client_limits import FlowControl, list_limits
from harvest_celery._client_ops import Operations
from harvest_celery._client_reads import Reads
from harvest_celery._client_schedules import Schedules
from harvest_celery._client_tasks import Tasks
from harvest_celery._client_updates import Updates
from harvest_celery._core.deadlines import Timeouts
from harvest_celery._core.ids import check_execution_id
from harvest_celery._core.invocation import register_start_task
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.limits import declare
from harvest_celery._core.registry import ActivityDefinition, Registry, register_into
from harvest_celery._core.retry import DEFAULT_RETRY, RetryPolicy
from harvest_celery._dag.builder import preflight, preflight_all
from harvest_celery._dag.canvas_run import register_canvas
from harvest_celery._payloads.codec import Codec
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._payloads.stores import PayloadStore
from harvest_celery._runtime import eager_start, logs
from harvest_celery._runtime import settings as config
from harvest_celery._runtime.adopt import adopt
from harvest_celery._runtime.celery import CeleryDispatcher, install, register_activity
from harvest_celery._runtime.consumers import QueueConsumers
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._runtime.metrics import METRICS
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._runtime.settings import (
    configure_celery,
    configure_dedicated_celery_app,
    fast_path_settings,
)
from harvest_celery._store import admission, starts
from harvest_celery._store import runs as ops
from harvest_celery._store.appconn import after_session_commit, payloads_on, start_on
from harvest_celery._store.migrate import upgrade
from harvest_celery._store.records import Timings, utcnow
from harvest_celery._store.starts import check_policy
from harvest_celery._store.store import Store
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")

EMBEDDED_URL = "sqlite:///harvest-embedded.db"


class Harvest(Operations, Reads, Tasks, Schedules, FlowControl, Updates):
    """Start, signal, cancel and inspect durable workflows.

    With a ``celery_app``, activities and decisions are Celery tasks on that app (run
    ``harvest worker``). Without one, the engine runs in **embedded mode**: SQLite-friendly, one
    process, an in-process worker that ``result()`` drives — for the demo and local development
    only (no row locks across processes).
    """

    def __init__(
        self,
        database_url: str | None = None,
        celery_app: Any = None,
        *,
        decision_queue: str = "harvest",
        max_activity_input_bytes: int | None = 2 * 1024 * 1024,
        timings: Timings | None = None,
        sweep_interval: float = 1.0,
        codec: Codec | None = None,
        payload_store: PayloadStore | None = None,
        offload_threshold: int = 256 * 1024,
        celery_error_detail: Literal["full", "type"] = "full",
        eager_max_chain: int | None = None,
        eager_start: bool | None = None,
        inline_decisions: bool | None = None,
        inline_cold_max_events: int = 500,
        sticky_sessions: bool | None = None,
        sticky_routing: bool = True,
        sticky_queue_expires: float = 300.0,
        max_sessions: int = 1000,
        fast_paths: bool = True,
        pool_size: int | None = None,
        max_overflow: int | None = None,
        claim_pool_size: int | None = None,
        claim_max_overflow: int | None = None,
        pooled: bool | None = None,
        listen_url: str | None = None,
        log_format: Literal["text", "json"] | None = None,
        tracing: bool | None = None,
        message_priority: bool | None = None,
    ) -> None:
        """Every keyword is a row of docs/configuration.md (None: its documented default). A bad
        value (or ``fast_paths=False`` beside a fast value) raises ``ValueError``, before connecting;
        ``tracing=True`` without the ``otel`` extra raises ``ImportError`` naming it, as early."""
        options = config.checked({k: v for k, v in locals().items() if k in config.BY_NAME})
        tracer = _tracing_module() if options["tracing"] else None  # before anything is built
        fast = (inline_decisions, sticky_sessions, eager_max_chain, eager_start)
        options.update(fast_path_settings(options["fast_paths"], *fast))
        self.database_url = database_url or EMBEDDED_URL
        payloads = Payloads(options["codec"], options["payload_store"], options["offload_threshold"])
        self.store = Store(
            self.database_url,
            payloads=payloads,
            pools=config.pools(options),
            listen_url=options["listen_url"],
        )
        self.registry = Registry()
        register_start_task(self.registry)  # reserved: every decision worker knows it
        register_canvas(self.registry)  # reserved too: harvest.start_canvas's runs
        # the cap applies to what is stored inline: with a store, an offloaded input is a reference
        offloads = payloads.offloads if payload_store is not None else None
        self.runtime = Runtime(self.store, self.registry, config.runtime_settings(options, offloads))
        # tracing on: the tracer module's object (docs/observability.md, "Tracing"); off: None
        self.tracing: Any = tracer.load(self.runtime) if tracer is not None else None
        logs.configure(options["log_format"])
        METRICS.limits.source = partial(list_limits, self.store)  # the limit gauges, when scraped
        METRICS.limits.admissions = self.store.admission_gauges  # and the admission gauges
        self._attach(celery_app)

    def _attach(self, celery_app: Any) -> None:
        """Dispatch through ``celery_app``'s broker, or (None) run embedded, in this process."""
        self.celery_app = celery_app
        self._inline: InlineDispatcher | None = None
        self._consumers: QueueConsumers | None = None  # asked by stuck() only, never the hot path
        if celery_app is not None:
            install(celery_app, self.runtime)
            self.runtime.dispatcher = CeleryDispatcher(celery_app, self.runtime.settings)
            self._consumers = QueueConsumers(celery_app)
        else:
            self._inline = InlineDispatcher()
            self.runtime.dispatcher = self._inline
            log.warning(
                "harvest-celery embedded mode: one process, in-process worker, no row locks "
                "across processes (%s). For the demo and local development only.",
                self.database_url,
            )

    @classmethod
    def from_env(cls, celery_app: Any = None, **kwargs: Any) -> Harvest:
        """``HARVEST_DATABASE_URL`` and ``HARVEST_BROKER_URL`` (a Celery app is made for the
        broker if none is given; no broker → embedded mode)."""
        database_url = os.environ.get("HARVEST_DATABASE_URL")
        broker = os.environ.get("HARVEST_BROKER_URL")
        if celery_app is None and broker:
            from celery import Celery

            celery_app = Celery("harvest", broker=broker)
            configure_dedicated_celery_app(celery_app)
        return cls(database_url, celery_app, **kwargs)

    # ── setup ────────────────────────────────────────────────────────────────────────────────
    def register(self, *objects: Any) -> Harvest:
        """Register decorated workflows, DAGs and activities (or whole modules of them)."""
        register_into(self.registry, objects)
        if self.celery_app is not None:
            for definition in self.registry.activities.values():
                register_activity(self.celery_app, self.runtime, definition)
        return self

    def adopt_task(
        self,
        name: str,
        *,
        queue: str = "default",
        retry: RetryPolicy | None = None,
        start_to_close: float | None = None,
        concurrency: int | None = None,
        rate_limit: str | None = None,
        limit_key: Callable[[Any], str] | None = None,
    ) -> None:
        """Use an existing Celery task as an activity by name (see docs/concepts.md). The limits
        apply when harvest dispatches it, never to a plain ``.delay()`` (docs/flow-control.md)."""
        limits = declare(concurrency, rate_limit, limit_key)
        definition = ActivityDefinition(
            name=name,
            fn=None,
            default_queue=queue,
            retry=retry or DEFAULT_RETRY,
            start_to_close=start_to_close,
            adopted=True,
            limits=limits,
        )
        self.registry.add_activity(definition)
        if self.celery_app is not None:
            adopt(self.celery_app, self.runtime, definition)

    def migrate(self) -> None:
        """Bring the schema to the latest Alembic revision."""
        upgrade(self.database_url)

    # ── commands ─────────────────────────────────────────────────────────────────────────────
    def start_workflow(
        self,
        name: str,
        input: Any = None,
        execution_id: str | None = None,
        *,
        connection: Any = None,
        id_reuse: str = "idempotent",
        scheduled_for: datetime | None = None,
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
        priority: int = 0,
    ) -> str:
        """Start a run and return its id (``execution_id``, or a new uuid).

        ``id_reuse`` — what a start of an id that exists does (docs/errors.md):

        * ``"idempotent"`` (default): the same workflow and input answer the existing run (a
          retried request starts nothing twice); another input raises
          ``ExecutionAlreadyExists`` (``conflict="input"``);
        * ``"use_existing"``: any run of that workflow with this id is the answer, whatever its
          input (the first start wins);
        * ``"reject"``: an existing id always raises ``ExecutionAlreadyExists``.

        An id taken by another workflow always raises it (``conflict="workflow"``). Concurrent
        starts of one id make one run. An id holding ``:``, ``/`` or a control character raises
        ``InvalidExecutionId`` and writes nothing.

        ``connection`` — start inside your own transaction, on the harvest database: a
        SQLAlchemy ``Connection`` or ``Session`` (Flask-SQLAlchemy's ``db.session``), a psycopg2
        or psycopg 3 connection, or a Django connection inside ``transaction.atomic()``. The run
        row, its ``WorkflowStarted`` and its offloaded blobs are written on that connection and
        nothing is committed here: if you roll back, no run exists and no message was sent; once
        you commit, the first decision is dispatched (docs/django.md, docs/flask.md).

        ``scheduled_for`` — the tick a scheduler starts this run for: recorded in
        ``WorkflowStarted`` and read as ``ctx.info.scheduled_for`` (docs/schedules.md).
        ``execution_timeout`` / ``run_timeout`` — the chain's and this run's deadlines, a timedelta
        or seconds, positive (docs/concepts.md, "Deadlines").

        ``priority`` — 0 to 9, 9 first: orders runs waiting for admission, and is the default of
        the run's activities'. A ``limit_key`` runs here, before any write (``InvalidLimitKey``);
        docs/flow-control.md."""
        self._preflight(name)
        payload = check_json(input, f"input of workflow {name!r}")
        execution_id = check_execution_id(execution_id or uuid.uuid4().hex)
        check_policy(id_reuse)
        timeouts = Timeouts.checked(execution_timeout, run_timeout)
        admitting = admission.prepare(self.registry, name, payload, priority)
        if _start_options(connection, scheduled_for, timeouts):
            return self._start_on(connection, name, payload, execution_id, id_reuse, admitting)
        options = {"id_reuse": id_reuse, "scheduled_for": scheduled_for, "timeouts": timeouts}
        self._start(name, payload, execution_id, admitting, **options)
        return execution_id

    def _start(
        self, name: str, payload: Any, execution_id: str, admitting: admission.Prepared, **options: Any
    ) -> None:
        """A start in a transaction of its own (``starts.start``'s ``options``), with the run's
        first decision when this process can take it (``_runtime.eager_start``); tracing on,
        with its span and the run span's pre-allocated context."""
        try:
            self._start_once(name, payload, execution_id, admitting, self._inline is None, **options)
        except eager_start.Fallback:
            self._start_once(name, payload, execution_id, admitting, False, **options)

    def _start_once(
        self,
        name: str,
        payload: Any,
        execution_id: str,
        admitting: admission.Prepared,
        eager: bool,
        **options: Any,
    ) -> None:
        traced = self.tracing.begin_start(name) if self.tracing is not None else None
        decided = None
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)  # its blobs in its own transaction
            admitting.declare(tx, name)
            created = starts.start(
                tx,
                execution_id,
                name,
                payload,
                utcnow(),
                self.runtime.settings.decision_queue,
                traceparent=traced.traceparent if traced is not None else None,
                admission=admitting.columns(self.store.dialect, tx.payloads, execution_id),
                **options,
            )
            if created and eager:
                decided = eager_start.decide(self.runtime, tx, execution_id, name)
        if traced is not None:
            self.tracing.started(traced, execution_id, created)  # committed: its span, then the sends
        if decided is not None:
            eager_start.after_commit(self.runtime, tx, decided)
        else:
            self._after(tx)

    def _start_on(
        self,
        connection: Any,
        name: str,
        payload: Any,
        execution_id: str,
        id_reuse: str,
        admitting: admission.Prepared,
    ) -> str:
        now = utcnow()
        started = start_on(
            connection,
            self.store,
            execution_id,
            name,
            payload,
            now,
            self.runtime.settings.decision_queue,
            id_reuse,
            admitting,
        )
        if started.created and started.on_commit is not None:
            started.on_commit(lambda: self._claim_start(execution_id, now, name, admitting))
        return execution_id

    def _claim_start(
        self, execution_id: str, requested_at: Any, name: str, admitting: admission.Prepared
    ) -> None:
        """After the application committed a start: claim it and send its first decision (a
        decision worker that heard the announcement may have claimed it first)."""
        queue = self.runtime.settings.decision_queue
        _, tx = self.store.transaction(
            lambda tx: starts.take_started(tx, [(execution_id, requested_at)], utcnow(), queue, admit=False),
            one_statement=True,
        )
        self.runtime._after_commit(tx)
        if admitting.limited:  # waiting for admission: settle its key, in a transaction (locks)

            def admit(tx: Tx) -> int:
                admitting.declare(tx, name)
                return admission.admit_started(tx, [execution_id])

            _, tx = self.store.transaction(admit)
            self.runtime._after_commit(tx)

    def start_workflow_on_commit(
        self,
        name: str,
        input: Any = None,
        execution_id: str | None = None,
        *,
        session: Any = None,
        using: str | None = None,
        id_reuse: str = "idempotent",
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
        priority: int = 0,
    ) -> str:
        """Start a run once your transaction commits, for an app whose database is *not* the
        harvest database; returns the id the run will have.

        The weaker guarantee: a rollback starts nothing, but the start is a second transaction
        made after your commit, so a crash between the two, or a start that fails (the harvest
        database unreachable, ``ExecutionAlreadyExists``), leaves your data committed and no run
        — logged, never raised into your commit. Give the run an id derived from your data (e.g.
        ``order-42``) so a reconciliation job can start what is missing, idempotently.

        ``session``: a SQLAlchemy ``Session`` (or ``scoped_session``) whose commit it waits for;
        otherwise Django's ``transaction.on_commit`` on database ``using``. Name, input, id and
        timeouts are checked now, before anything is deferred; the deadlines count from the
        start, after your commit."""
        self._preflight(name)
        payload = check_json(input, f"input of workflow {name!r}")
        run_id = check_execution_id(execution_id or uuid.uuid4().hex)
        check_policy(id_reuse)
        timeouts = Timeouts.checked(execution_timeout, run_timeout)
        admission.prepare(self.registry, name, payload, priority)  # a bad priority or key: now

        def start() -> None:
            try:
                self.start_workflow(
                    name,
                    payload,
                    run_id,
                    id_reuse=id_reuse,
                    execution_timeout=timeouts.execution,
                    run_timeout=timeouts.run,
                    priority=priority,
                )
            except Exception:  # noqa: BLE001 - after the app's commit: logged, not raised
                log.exception(
                    "harvest: the deferred start of %s (%s) failed after the application "
                    "committed; no run was started",
                    run_id,
                    name,
                    extra=logs.run(run_id),
                )

        if session is not None:
            after_session_commit(session, start)
        else:
            from django.db import transaction  # Django apps only

            transaction.on_commit(start, using=using, robust=True)
        return run_id

    def signal(self, execution_id: str, name: str, payload: Any = None) -> None:
        payload = check_json(payload, f"payload of signal {name!r}")
        with self.store.begin() as tx:
            ops.signal(tx, execution_id, name, payload, utcnow(), self.runtime.settings.decision_queue)
        self._after(tx)

    def signal_with_start(
        self,
        workflow: str,
        input: Any,
        execution_id: str,
        signal: str,
        payload: Any = None,
        *,
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
        priority: int = 0,
    ) -> str:
        """Start the run if it does not exist, and deliver the signal — one transaction. An
        existing run of ``workflow`` gets the signal whatever its input (``id_reuse=
        "use_existing"``); a run of another workflow raises ``ExecutionAlreadyExists``. The
        timeouts apply only if it creates the run (the first start's deadlines stand), as do
        ``priority`` and the admission of a limited workflow: a run it creates waiting holds the
        signal, undecided, until it is admitted."""
        self._preflight(workflow)
        payload = check_json(payload, f"payload of signal {signal!r}")
        data = check_json(input, f"input of workflow {workflow!r}")
        check_execution_id(execution_id)
        timeouts = Timeouts.checked(execution_timeout, run_timeout)
        admitting = admission.prepare(self.registry, workflow, data, priority)
        now = utcnow()
        q = self.runtime.settings.decision_queue
        traced = self.tracing.begin_start(workflow) if self.tracing is not None else None
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)
            admitting.declare(tx, workflow)
            # its input only matters if it creates the run: an existing run of the workflow is it
            created = starts.start(
                tx,
                execution_id,
                workflow,
                data,
                now,
                q,
                id_reuse="use_existing",
                timeouts=timeouts,
                traceparent=traced.traceparent if traced is not None else None,
                admission=admitting.columns(self.store.dialect, tx.payloads, execution_id),
            )
            ops.signal(tx, execution_id, signal, payload, now, q)
        if traced is not None:
            self.tracing.started(traced, execution_id, created)
        self._after(tx)
        return execution_id

    def cancel_workflow_execution(self, execution_id: str, reason: str = "") -> str:
        """Seal a live run: ``WorkflowCancelled`` is appended, the run is CANCELLED at once (FAILED
        if an unwind had begun), unstarted activities never run, and the post-cancel decision
        replays the workflow with ``ctx.is_cancelled()`` true. Never compensates by itself."""
        with self.store.begin() as tx:
            status = ops.cancel(tx, execution_id, reason, utcnow(), self.runtime.settings.decision_queue)
        self._after(tx)
        return status

    def request_cancellation(self, execution_id: str, reason: str = "") -> bool:
        """Cooperative cancel (opt-in, beyond the spec): record ``WorkflowCancelRequested``
        without sealing. The run stays live — shown CANCELLING — and ``ctx.is_cancelled()``
        turns true at the request's position in history, so the workflow's cancel branch can
        run durable compensations as activities; the run ends CANCELLED when the workflow
        raises ``Cancelled`` (COMPLETED if it completes anyway). Activities can ask
        ``activity_context().is_cancelled()``. A later ``cancel_workflow_execution`` still
        seals. Returns False if a request was already open (no second event)."""
        with self.store.begin() as tx:
            recorded = ops.request_cancellation(
                tx, execution_id, reason, utcnow(), self.runtime.settings.decision_queue
            )
        self._after(tx)
        return recorded

    def _preflight(self, name: str) -> None:
        definition = self.registry.workflow(name)
        if definition.kind == "dag":
            preflight(definition.extra, self.registry)

    def preflight(self) -> None:
        """Every DAG's activities and compensators are registered (run at worker boot)."""
        preflight_all(self.registry)


__all__ = ["Harvest", "configure_celery", "configure_dedicated_celery_app"]


def _start_options(connection: Any, scheduled_for: datetime | None, timeouts: Timeouts) -> bool:
    """Check a start's ``scheduled_for`` and what ``connection=`` does not take; True: the start
    is made on ``connection``."""
    if scheduled_for is not None and (
        not isinstance(scheduled_for, datetime) or scheduled_for.tzinfo is None
    ):
        raise ValueError(f"scheduled_for is an aware datetime, not {scheduled_for!r}")
    if connection is None:
        return False
    if scheduled_for is not None:
        raise ValueError("scheduled_for is not taken with connection=")
    if timeouts:
        raise ValueError(
            "execution_timeout and run_timeout are not taken with connection= (not built yet): "
            "start without it, or with start_workflow_on_commit"
        )
    return True


def _tracing_module() -> ModuleType:
    """The tracer module, imported only when tracing is on (``scripts/shape.py``'s
    ``OPTIONAL_LAZY``); without the ``otel`` extra, an error that names it."""
    try:
        from harvest_celery._runtime import tracing
    except ImportError as exc:
        raise ImportError(
            "Harvest(tracing=True) / HARVEST_TRACING=1 needs the otel extra: "
            f"pip install 'harvest-celery[otel]' (cannot import {exc.name or exc})"
        ) from exc
    return tracing


def _store(database_url: str, payloads: Payloads, options: dict[str, Any]) -> Store:
    """The store, with the pool settings and what listens (``listen_url``, ``pooled``)."""
    return Store(
        database_url, payloads=payloads, pools=config.pools(options), listen_url=options["listen_url"]
    )
