"""Every setting a user may change, in one table: ``KEYWORDS`` (docs/configuration.md shows it).

One row per ``Harvest(...)`` keyword: its effective default (what the keyword is when it is not
given, or given as None), what it accepts (the ``ValueError`` a bad value raises says so) and,
for the pool sizes, the environment variable read when the keyword is not given. ``checked``
runs every row before ``Harvest`` makes anything that could connect. A new setting is one more
row here, a keyword in ``Harvest.__init__``, a field of ``Settings`` (or wherever it is used) and
a row of docs/configuration.md; tests/unit/test_configuration.py holds the four together.

``Settings`` is the runtime's view of them. Users set ``harvest.runtime.settings`` before these
were keywords, so it stays a plain mutable dataclass.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harvest_celery._core.engine import EngineConfig
from harvest_celery._store.dialect import Pools
from harvest_celery._store.records import Timings


@dataclass
class Settings:
    decision_queue: str = "harvest"
    engine: EngineConfig = field(default_factory=EngineConfig)
    timings: Timings = field(default_factory=Timings)
    sweep_interval: float = 1.0
    relay_after: float = 10.0  # an outbox row (older builds) older than this is relayed
    sticky_sessions: bool = True  # keep warm executions' replays between decisions
    # route a run's decision requests to the worker process holding its warm replay (its own
    # queue, consumed by that process only; a thread or solo pool — prefork children share one)
    sticky_routing: bool = True
    # a sticky queue with no consumer for this long is deleted by RabbitMQ (x-expires; sticky.py)
    sticky_queue_expires: float = 300.0
    max_sessions: int = 1000
    # decide in the completing worker's transaction (False: always through the decision task)
    inline_decisions: bool = True
    # ...unless the run is cold here and its history is longer than this: its warm session is
    # likely held by another process, and a cold replay here would cost more than the hop
    inline_cold_max_events: int = 500
    # eager activity execution: a decision taken inline in a Celery worker that consumes the
    # next activity's queue runs it in the same thread (through the claim) instead of sending
    # it, at most this many in a row (0: off)
    eager_max_chain: int = 8
    # a start in its own transaction, in a process that registered the workflow, takes the
    # run's first decision in that transaction (eager_start.py; False: the decision task does)
    eager_start: bool = True
    # what a failed attempt shows Celery (Flower, Sentry, task_failure): "full" (the exception
    # and its traceback) or "type" (its type only; exception text can quote the payload)
    celery_error_detail: str = "full"
    # False: every step through the decision task — shorthand for inline_decisions=False,
    # sticky_sessions=False, eager_max_chain=0, eager_start=False (a debugging switch;
    # docs/operations.md)
    fast_paths: bool = True
    # harvest's own loggers: "text" (as the application configures them) or "json" (one JSON
    # object per line, _runtime/logs.py); the application's logging is never changed
    log_format: str = "text"
    # OpenTelemetry spans (docs/observability.md, "Tracing"): the tracer module is imported only
    # when on, and needs the ``otel`` extra
    tracing: bool = False
    # an activity's priority (0..9, 9 first) as its message's priority, mapped for the broker
    # (``messages.broker_priority``; docs/flow-control.md, "Message priority"): off, harvest
    # orders only what waits in Postgres and its messages carry no priority
    message_priority: bool = False

    def __post_init__(self) -> None:
        if not self.fast_paths:
            self.inline_decisions, self.sticky_sessions, self.eager_max_chain = False, False, 0
            self.eager_start = False


def _count(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _seconds(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _flag(v: Any) -> bool:
    return isinstance(v, bool)


def _queue(v: Any) -> bool:
    return isinstance(v, str) and v != "" and v.strip() == v


def _url(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v.startswith("postgresql"))


def _yes_no(text: str) -> Any:
    """An environment variable's text as a flag (``1``/``true``/``yes``, ``0``/``false``/``no``)."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    return text


def _shaped(*attributes: str) -> Callable[[Any], bool]:
    return lambda v: v is None or all(hasattr(v, a) for a in attributes)


@dataclass(frozen=True)
class Keyword:
    name: str
    default: Any  # the effective default
    accepts: str  # what a good value is, as the ValueError says it
    valid: Callable[[Any], bool]
    env: str | None = None  # read when the keyword is not given
    none_allowed: bool = False  # None is a value of its own, not "the default"
    parse: Callable[[str], Any] | None = None  # the environment variable's text as a value


KEYWORDS: tuple[Keyword, ...] = (
    Keyword("decision_queue", Settings.decision_queue, "a non-empty queue name", _queue),
    Keyword(
        "max_activity_input_bytes",
        EngineConfig.max_activity_input_bytes,
        "a byte count of at least 0, or None (no cap)",
        _count(0),
        none_allowed=True,
    ),
    Keyword("timings", Timings(), "a harvest_celery.Timings", lambda v: isinstance(v, Timings)),
    Keyword("sweep_interval", Settings.sweep_interval, "seconds above 0", _seconds),
    Keyword(
        "codec", None, "a Codec (codec_id, encode, decode) or None", _shaped("codec_id", "encode", "decode")
    ),
    Keyword(
        "payload_store",
        None,
        "a PayloadStore (store_id, put, get, delete) or None",
        _shaped("store_id", "put", "get", "delete"),
    ),
    Keyword("offload_threshold", 256 * 1024, "a byte count of at least 0", _count(0)),
    Keyword(
        "celery_error_detail",
        Settings.celery_error_detail,
        '"full" or "type"',
        lambda v: isinstance(v, str) and v in ("full", "type"),
    ),
    Keyword("eager_max_chain", Settings.eager_max_chain, "a count of at least 0 (0: off)", _count(0)),
    Keyword("eager_start", Settings.eager_start, "True or False", _flag),
    Keyword("inline_decisions", Settings.inline_decisions, "True or False", _flag),
    Keyword("inline_cold_max_events", Settings.inline_cold_max_events, "a count of at least 0", _count(0)),
    Keyword("sticky_sessions", Settings.sticky_sessions, "True or False", _flag),
    Keyword("sticky_routing", Settings.sticky_routing, "True or False", _flag),
    Keyword("sticky_queue_expires", Settings.sticky_queue_expires, "seconds above 0", _seconds),
    Keyword("max_sessions", Settings.max_sessions, "a count of at least 0", _count(0)),
    Keyword("fast_paths", Settings.fast_paths, "True or False", _flag),
    Keyword("pool_size", Pools.size, "a count of at least 1", _count(1), env="HARVEST_POOL_SIZE"),
    Keyword("max_overflow", Pools.overflow, "a count of at least 0", _count(0), env="HARVEST_MAX_OVERFLOW"),
    Keyword(
        "claim_pool_size", Pools.claim_size, "a count of at least 1", _count(1), env="HARVEST_CLAIM_POOL_SIZE"
    ),
    Keyword(
        "claim_max_overflow",
        Pools.claim_overflow,
        "a count of at least 0",
        _count(0),
        env="HARVEST_CLAIM_MAX_OVERFLOW",
    ),
    Keyword(
        "pooled",
        False,
        "True or False (HARVEST_DATABASE_POOLED: 1 or 0)",
        _flag,
        env="HARVEST_DATABASE_POOLED",
        parse=_yes_no,
    ),
    Keyword("listen_url", None, "a postgresql URL or None", _url, env="HARVEST_LISTEN_URL", parse=str),
    Keyword(
        "log_format",
        Settings.log_format,
        '"text" or "json"',
        lambda v: v in ("text", "json"),
        env="HARVEST_LOG_FORMAT",
        parse=str,
    ),
    Keyword(
        "tracing",
        Settings.tracing,
        "True or False (HARVEST_TRACING: 1 or 0)",
        _flag,
        env="HARVEST_TRACING",
        parse=_yes_no,
    ),
    Keyword(
        "message_priority",
        Settings.message_priority,
        "True or False (HARVEST_MESSAGE_PRIORITY: 1 or 0)",
        _flag,
        env="HARVEST_MESSAGE_PRIORITY",
        parse=_yes_no,
    ),
)
BY_NAME = {keyword.name: keyword for keyword in KEYWORDS}


def checked(given: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Every keyword's effective value; ``ValueError`` naming the first bad one and what it
    accepts. ``given``: the keywords as passed (absent, or None: not given — unless None is a
    value of the keyword's own)."""
    out: dict[str, Any] = {}
    for keyword in KEYWORDS:
        value = given.get(keyword.name)
        source = f"Harvest({keyword.name}={value!r})"
        if value is None and keyword.none_allowed and keyword.name in given:
            out[keyword.name] = None
            continue
        text = environ.get(keyword.env, "").strip() if keyword.env else ""
        if value is None and text:
            source = f"{keyword.env}={text!r}"
            if keyword.parse is not None:
                value = keyword.parse(text)
            else:
                value = int(text) if text.lstrip("-").isdigit() else text
        if value is None:
            value = keyword.default
        if not keyword.valid(value):
            raise ValueError(f"{source}: {keyword.name} accepts {keyword.accepts}")
        out[keyword.name] = value
    return out


def runtime_settings(options: Mapping[str, Any], offloads: Callable[[Any], bool] | None) -> Settings:
    """The runtime's settings from ``checked``'s values (``offloads``: does the payload store take
    a value, leaving only a reference inline — what the activity-input cap applies to)."""
    engine = EngineConfig(max_activity_input_bytes=options["max_activity_input_bytes"], offloads=offloads)
    fields = {name: options[name] for name in Settings.__dataclass_fields__ if name in options}
    return Settings(engine=engine, **fields)


def pools(options: Mapping[str, Any]) -> Pools:
    return Pools(
        size=options["pool_size"],
        overflow=options["max_overflow"],
        claim_size=options["claim_pool_size"],
        claim_overflow=options["claim_max_overflow"],
        pooled=options["pooled"],
    )


def framework_keywords(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The keywords a Django or Flask configuration sets: ``<prefix><NAME>`` for each (only
    those present; docs/configuration.md lists the keys)."""
    return {k.name: config[prefix + k.name.upper()] for k in KEYWORDS if prefix + k.name.upper() in config}


# ── the Celery side ──────────────────────────────────────────────────────────────────────────
def configure_dedicated_celery_app(app: Any) -> None:
    """Set the Celery configuration harvest-celery relies on (at-least-once, fair dispatch) as
    ``app``'s defaults — for a Celery app made only for harvest (what ``Harvest.from_env`` makes).

    It changes defaults of the whole app (``task_acks_late``, ``task_default_queue``,
    ``task_ignore_result``…), so never call it on your team's own app: harvest sets what its own
    tasks need on those tasks (docs/quickstart.md, docs/operations.md)."""
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue="default",
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        # Celery 5.7, pools without an event loop (threads, solo): after a reconnect the worker
        # restores its reduced prefetch with a synchronous basic.qos from the pool thread that
        # acks, racing the consumer thread on one AMQP connection; the worker then fetches
        # nothing more (docs/operations.md, "Brokers and sticky queues").
        worker_enable_prefetch_count_reduction=False,
    )


def configure_celery(app: Any) -> None:
    """Deprecated: ``configure_dedicated_celery_app`` (the same function, under the name that
    says what it is for). Kept for one minor release."""
    warnings.warn(
        "configure_celery is deprecated: call configure_dedicated_celery_app (for a Celery "
        "app made only for harvest)",
        DeprecationWarning,
        stacklevel=2,
    )
    configure_dedicated_celery_app(app)


# ── fast_paths ──────────────────────────────────────────────────────────────────────────────
_FAST = {"inline_decisions": True, "sticky_sessions": True, "eager_start": True}  # eager_max_chain: any > 0


def fast_path_settings(
    fast_paths: bool,
    inline_decisions: bool | None,
    sticky_sessions: bool | None,
    eager_max_chain: int | None,
    eager_start: bool | None = None,
) -> dict[str, Any]:
    """The four settings ``fast_paths`` stands for, as ``Settings`` keywords: ``False`` is
    shorthand for ``inline_decisions=False, sticky_sessions=False, eager_max_chain=0,
    eager_start=False`` (every step through the decision task). An explicit setting (not None)
    wins when ``fast_paths`` is True; with ``fast_paths=False``, one passed at its fast value is
    a contradiction: ValueError naming both."""
    given = {
        "inline_decisions": inline_decisions,
        "sticky_sessions": sticky_sessions,
        "eager_max_chain": eager_max_chain,
        "eager_start": eager_start,
    }
    if not fast_paths:
        for name, value in given.items():
            if value is not None and (value > 0 if name == "eager_max_chain" else value is _FAST[name]):
                raise ValueError(
                    f"fast_paths=False contradicts {name}={value!r}: fast_paths=False "
                    "means inline_decisions=False, sticky_sessions=False, "
                    "eager_max_chain=0 and eager_start=False; pass one or the other"
                )
        return {
            "inline_decisions": False,
            "sticky_sessions": False,
            "eager_max_chain": 0,
            "eager_start": False,
        }
    return {name: value for name, value in given.items() if value is not None}
