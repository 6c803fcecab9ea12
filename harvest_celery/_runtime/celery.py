"""Dispatch through Celery: the decision task, one Celery task per activity, the pre-run claim.

Every engine-dispatched activity goes through the ``task_prerun`` hook, which claims the task row
and appends ``ActivityStarted`` before the body runs. Celery only logs a signal handler's
exception, so the hook alone cannot stop a body: ``ActivityTask.__call__`` refuses to run the
body unless the claim committed. A body that executed therefore always has an ``ActivityStarted``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from celery import Celery, Task, signals
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker import state as worker_state

from harvest_celery._core.registry import ActivityDefinition
from harvest_celery._dag.builder import preflight_all
from harvest_celery._errors import StartToCloseTimeout
from harvest_celery._runtime import claim as claims
from harvest_celery._runtime import eager, sentry
from harvest_celery._runtime.celery_compat import is_eager
from harvest_celery._runtime.messages import DECIDE_TASK, Message, broker_priority
from harvest_celery._runtime.metrics import serve
from harvest_celery._runtime.outcomes import settle, stops_the_worker
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._runtime.settings import Settings
from harvest_celery._runtime.sticky import is_sticky, sticky_queue
from harvest_celery._store.records import Claim

log = logging.getLogger("harvest_celery")

_NOT_CLAIMED = object()


class CeleryDispatcher:
    def __init__(self, app: Celery, settings: Settings | None = None) -> None:
        self.app = app
        self.settings = settings or Settings()
        self._driver: str | None = None  # the broker's kombu transport, read at the first mapping

    def send(self, message: Message) -> None:
        queue: Any = message.queue
        if is_sticky(queue, self.settings.decision_queue):  # declared as its consumer declares it
            queue = sticky_queue(self.app, queue, self.settings.sticky_queue_expires)
        options = dict(message.time_limits)
        priority = self.message_priority(message)
        if priority is not None:
            options["priority"] = priority
        self.app.send_task(
            message.task_name,
            args=message.args,
            kwargs=message.kwargs,
            queue=queue,
            task_id=message.task_id,
            headers=message.headers or None,
            ignore_result=True,
            **options,
        )

    def message_priority(self, message: Message) -> int | None:
        """The message's ``priority`` option: None (Celery's default) unless
        ``message_priority`` is on and the message is an activity attempt's, then its priority
        mapped for this app's broker (``broker_priority``). The app's queues are never touched."""
        if not self.settings.message_priority or message.priority is None:
            return None
        if self._driver is None:
            self._driver = broker_driver(self.app)
            if broker_priority(0, self._driver) is None:
                log.warning(
                    "message_priority is on, but broker transport %r has no message priority "
                    "harvest maps: messages are sent without one",
                    self._driver,
                )
        return broker_priority(message.priority, self._driver)


def broker_driver(app: Celery) -> str:
    """The kombu transport of ``app``'s broker (``amqp``, ``redis``, ...), without connecting;
    ``""`` when it cannot be resolved."""
    try:
        with app.connection_for_write() as connection:  # not connected: its transport class only
            return str(connection.transport.driver_type)
    except Exception:  # noqa: BLE001 - an unresolvable transport maps to no priority, loudly
        log.warning("cannot resolve the broker transport of %r", app.main, exc_info=True)
        return ""


class ActivityTask(Task):  # type: ignore[misc]
    """Base of every engine-native activity task. Its arguments are ids, never the payload.

    Its options are its own, never app-wide: acked after the body (a killed worker's message
    is redelivered; the claim absorbs the duplicate), acked too when the attempt failed (the
    engine retries by its own policy, never Celery), no result or error in the app's result
    backend (the outcome lives in Postgres)."""

    acks_late = True
    reject_on_worker_lost = True
    acks_on_failure_or_timeout = True
    ignore_result = True
    store_errors_even_if_ignored = False
    typing = False
    harvest_runtime: Runtime
    harvest_definition: ActivityDefinition

    def __call__(self, execution_id: str, activity_id: str, attempt: int) -> None:
        claim = getattr(self.request, "harvest_claim", _NOT_CLAIMED)
        if claim is _NOT_CLAIMED:
            # Called without the pre-run hook (e.g. .apply()): claim here, same rules.
            claim = claims.claim(self.harvest_runtime, execution_id, activity_id, attempt)
        assert claim is None or isinstance(claim, Claim)
        fn = self.harvest_definition.fn
        assert fn is not None
        runtime = self.harvest_runtime
        # no eager chain under a deadline: it would run under this message's time limit
        eager_ok = claim is not None and claim.start_to_close is None and not _time_limited(self)
        with runtime.eager_scope(eager_ok) as take:
            ran, error = claims.run_claimed(runtime, claim, _timeout_as_failure(fn))
            del claim  # its input must not sit in a frame an error tracker captures
            if error is None or not stops_the_worker(runtime, error):  # no new body at shutdown
                eager.run_chain(self.app, self.request.hostname, runtime, take, _timeout_as_failure)
        if error is not None:  # Sentry's Celery integration reports it with the attempt's tags
            sentry.tag_attempt(execution_id, self.name, attempt)
        settle(runtime, ran, error, self.request.id)


def _time_limited(task: Any) -> bool:
    """Does this task run under a Celery time limit — its message's, its own or the app's
    (``task_time_limit``)? An eager chain inside it would run under that limit too."""
    conf = task.app.conf
    limits = (
        *(getattr(task.request, "timelimit", None) or ()),
        task.time_limit,
        task.soft_time_limit,
        conf.task_time_limit,
        conf.task_soft_time_limit,
    )
    return any(limits)


def _timeout_as_failure(fn: Any) -> Any:
    def run(value: Any) -> Any:
        try:
            return fn(value)
        except SoftTimeLimitExceeded:
            raise StartToCloseTimeout("start_to_close exceeded") from None

    return run


def _on_prerun(sender: Any = None, task: Any = None, args: Any = None, **_kw: Any) -> None:
    runtime = getattr(task, "harvest_runtime", None)
    if runtime is None or not isinstance(task, ActivityTask) or not args or len(args) != 3:
        return
    if is_eager(task.request):
        return  # an eager attempt (celery_compat): claimed before its task_prerun, never twice
    task.request.harvest_claim = claims.claim(runtime, *args)


def _route_to_this_process(app: Celery, runtime: Runtime, worker: Any) -> None:
    """Sticky routing: a worker whose pool runs in its own process (threads, solo) consumes a
    queue of its own, ``<decision queue>@<node name>``; a run whose warm replay it holds has its
    decision requests sent there, so decision cost stays flat with several decision processes.
    Prefork children share their parent's queues, so there sessions stay where they land."""
    pool = getattr(getattr(worker, "pool_cls", None), "__module__", "") or ""
    if not runtime.settings.sticky_routing or "prefork" in pool:
        return
    runtime.sticky_queue = f"{runtime.settings.decision_queue}@{worker.hostname}"
    queue = sticky_queue(app, runtime.sticky_queue, runtime.settings.sticky_queue_expires)
    app.amqp.queues.select_add(queue)  # type: ignore[union-attr]


def _pool_idle(worker: Any) -> Callable[[], bool] | None:
    """For a ``-P threads`` worker: is a thread of its pool free, with no delivered message
    waiting for one? Then an eager chain takes nothing from other work by going on (any message
    the broker has could still be delivered to the free thread). Other pools cannot tell from
    the chain's thread (a prefork child does not see its parent's requests; a solo worker has
    no second slot), so their chains stop at ``eager_max_chain``."""
    pool = getattr(getattr(worker, "pool_cls", None), "__module__", "") or ""
    concurrency = int(getattr(worker, "concurrency", 0) or 0)
    if "thread" not in pool or concurrency < 2:
        return None
    reserved, active = worker_state.reserved_requests, worker_state.active_requests

    def idle() -> bool:
        running = len(active)
        return running < concurrency and len(reserved) <= running

    return idle


def install(app: Celery, runtime: Runtime) -> None:
    """Register the decision task and connect the hooks (idempotent per app)."""
    if getattr(app, "_harvest_runtime", None) is runtime:
        return
    app._harvest_runtime = runtime  # type: ignore[attr-defined]

    # shared=False: with two Celery apps in one process each keeps its own runtime.
    # Options per task, never app-wide: joining an app changes nothing for its own tasks.
    @app.task(
        name=DECIDE_TASK,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        store_errors_even_if_ignored=False,
        typing=False,
        shared=False,
        bind=True,
    )
    def decide(self: Any, execution_id: str) -> None:
        # the activity this decision schedules on a queue this worker consumes runs here too
        # (eager execution), so a decision taken by the process holding the run's warm replay
        # does not send its next step away from that replay
        with runtime.eager_scope(not _time_limited(self)) as take:
            runtime.run_decision(execution_id)
            eager.run_chain(app, self.request.hostname, runtime, take, _timeout_as_failure)

    signals.task_prerun.connect(_on_prerun, weak=False)
    _connect_worker_signals(app, runtime)


def _connect_worker_signals(app: Celery, runtime: Runtime) -> None:
    """The worker's start, init and shutdown hooks for this app: the sweeper and metrics
    endpoint once ready, the queues and preflight at init, ``shutting_down`` on shutdown."""

    def _start_sweeper(sender: Any = None, **_kw: Any) -> None:
        consumer = getattr(sender, "app", None)
        if consumer is not app:
            return
        runtime.event_source = sender  # task events may be switched on later (enable_events)
        queues = set(app.amqp.queues.consume_from or {})  # type: ignore[union-attr]
        if runtime.settings.decision_queue in queues:
            runtime.sweeper.start()
            log.info("harvest sweeper started (decision queue %r)", runtime.settings.decision_queue)
        port = os.environ.get("HARVEST_METRICS_PORT")
        if port:
            try:
                serve(int(port), os.environ.get("HARVEST_METRICS_ADDR", "127.0.0.1"))
            except OSError as exc:  # the worker works without its metrics endpoint; say so loudly
                log.error("cannot serve metrics on port %s: %s", port, exc)

    signals.worker_ready.connect(_start_sweeper, weak=False)

    def _shutting_down(**_kw: Any) -> None:
        runtime.shutting_down.set()

    signals.worker_shutting_down.connect(_shutting_down, weak=False)

    def _preflight(sender: Any = None, **_kw: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        _route_to_this_process(app, runtime, sender)
        runtime.pool_idle = _pool_idle(sender)
        # this worker's queues (set before the pool starts, so prefork children inherit them)
        runtime.local_queues = frozenset(app.amqp.queues.consume_from or ())  # type: ignore[union-attr]
        runtime.send_task_events = bool(getattr(sender, "task_events", False))
        _check_call_convention(runtime)
        try:
            preflight_all(runtime.registry)
        except Exception as exc:
            log.critical("harvest preflight failed: %s", exc)
            raise SystemExit(f"harvest preflight failed: {exc}") from exc
        runtime.sync_limits()

    signals.worker_init.connect(_preflight, weak=False)


def _check_call_convention(runtime: Runtime) -> None:
    """On a schema older than migration 0008, ``ctx.execute_task`` refuses (``InvalidTaskCall``)
    rather than record a call an older worker would pass as one argument (docs/operations.md)."""
    try:
        current = runtime.store.has_call_convention()
    except Exception:  # noqa: BLE001 - an unreachable database at boot: the decisions will say so
        log.warning("could not read the schema at worker start", exc_info=True)
        return
    if not current:
        log.warning("the schema is older than migration 0008: ctx.execute_task refuses until it is migrated")
        runtime.settings.engine = dataclasses.replace(runtime.settings.engine, task_calls=False)


def register_activity(app: Celery, runtime: Runtime, definition: ActivityDefinition) -> None:
    """A Celery task named after the activity, so Flower shows ``charge_payment``."""
    if definition.adopted:
        return  # an existing task: guarded by _adopt, never replaced
    existing = app.tasks.get(definition.name) if definition.name in app.tasks else None
    if existing is not None and getattr(existing, "harvest_definition", None) is definition:
        return
    time_limits: dict[str, Any] = {}
    if definition.start_to_close:
        time_limits = {
            "soft_time_limit": definition.start_to_close,
            "time_limit": definition.start_to_close + 5,
        }
    app.task(
        name=definition.name,
        base=ActivityTask,
        bind=False,
        shared=False,
        harvest_runtime=runtime,
        harvest_definition=definition,
        **time_limits,
    )(_activity_placeholder)


def _activity_placeholder(*_args: Any) -> None:
    """Never runs: ``ActivityTask.__call__`` is the body."""
