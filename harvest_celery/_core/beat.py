"""Celery Beat's ``beat_schedule`` as harvest schedules (``Harvest.import_beat``, docs/schedules.md
"Migrating from Celery Beat"): each entry becomes a schedule that starts the existing task on
every tick, or a refusal naming what harvest cannot honour.

- ``crontab`` becomes ``cron``: five fields from the crontab's expanded sets, in the app's
  timezone. Celery fires a crontab only on a day that matches *both* ``day_of_month`` and
  ``day_of_week``, where cron fires on either: a crontab restricting both is refused.
- A ``timedelta``, a number of seconds or ``schedule(run_every=...)`` becomes ``every`` (whole
  seconds, anchored at the Unix epoch rather than Beat's start).
- Refused by name: ``solar``, ``relative=True``, any option but ``queue``, a custom ``nowfun``,
  any other schedule class (a subclass too), and a name that is no schedule name (``:``, ``/``).

Pure: Celery's schedule classes are told by their qualified name (this package imports no
Celery), so a subclass, whose behaviour harvest cannot know, is a custom class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from harvest_celery._core.schedule import Spec, check_name
from harvest_celery._errors import InvalidSchedule

ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative"})
OPTION_REASONS: Mapping[str, str] = {
    "expires": "honouring it needs a schedule-to-start deadline, which harvest does not have yet",
    "priority": "harvest dispatches by queue only",
    "exchange": "it goes beyond a queue; name a queue instead",
    "routing_key": "it goes beyond a queue; name a queue instead",
    "countdown": "a tick starts at its own time; use the schedule's jitter for a delay",
    "eta": "a tick starts at its own time",
}
CELERY = "celery.schedules."
# (low, high) of each crontab field, in cron's field order
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31), ("month_of_year", 1, 12))


class Unsupported(Exception):
    """An entry harvest cannot honour; the message says why."""


@dataclass(frozen=True)
class BeatEntry:
    """One Beat entry as a task schedule: ``cron`` (with ``timezone``) or ``every`` seconds,
    and the task's call."""

    name: str
    task: str
    spec: Spec
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None


@dataclass(frozen=True)
class BeatImport:
    """What an import did: the schedules created, left alone (identical), updated (with
    ``update=True``), and the entries refused and skipped (``skip_unsupported=True``), each
    with its reason."""

    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def beat_schedule_of(source: Any) -> tuple[Mapping[str, Any], str]:
    """The entries and the timezone of a Celery app (``conf.beat_schedule``, ``conf.timezone``
    or UTC), or of a ``beat_schedule`` mapping (UTC)."""
    if isinstance(source, Mapping):
        return source, "UTC"
    conf = getattr(source, "conf", None)
    entries = getattr(conf, "beat_schedule", None) if conf is not None else None
    if conf is None or not isinstance(entries, Mapping):
        raise InvalidSchedule(
            f"import_beat takes a Celery app or its beat_schedule mapping, not {type(source).__name__}"
        )
    zone = getattr(conf, "timezone", None) or "UTC"
    return entries, str(getattr(zone, "key", zone))


def convert(name: Any, entry: Any, timezone: str) -> BeatEntry:
    """One entry as a task schedule, or ``Unsupported`` saying why."""
    try:
        check_name(name)
    except InvalidSchedule as exc:
        raise Unsupported(str(exc)) from None
    if not isinstance(entry, Mapping):
        raise Unsupported(f"an entry is a dict, not {type(entry).__name__}")
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise Unsupported(f"{', '.join(map(repr, unknown))} is not a Beat entry key")
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise Unsupported(f"'task' must name a task, not {task!r}")
    if entry.get("relative"):
        raise Unsupported("relative=True is refused: every= is anchored at the Unix epoch")
    args, kwargs = entry.get("args") or (), entry.get("kwargs") or {}
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
        raise Unsupported("'args' must be a list or tuple and 'kwargs' a dict")
    if "queue" in kwargs:  # as start_task refuses it: the durable call's one reserved keyword
        raise Unsupported("kwargs 'queue' is refused: queue is a reserved keyword of a durable task call")
    return BeatEntry(
        name,
        task,
        spec_of(entry.get("schedule"), timezone),
        list(args),
        dict(kwargs),
        queue_of(entry.get("options") or {}),
    )


def queue_of(options: Any) -> str | None:
    """The entry's ``queue`` option (honoured); every other option is refused by name."""
    if not isinstance(options, Mapping):
        raise Unsupported(f"'options' must be a dict, not {type(options).__name__}")
    refused = [
        f"option {k!r} ({OPTION_REASONS.get(k, 'not supported by an imported schedule')})"
        for k in sorted(options, key=str)
        if k != "queue"
    ]
    if refused:
        raise Unsupported("; ".join(refused) + " is refused")
    queue = options.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise Unsupported(f"option 'queue' must be a queue name, not {queue!r}")
    return queue


def spec_of(schedule: Any, timezone: str) -> Spec:
    """The spec of a Beat schedule, or ``Unsupported``."""
    kind = f"{type(schedule).__module__}.{type(schedule).__qualname__}"
    if isinstance(schedule, bool) or schedule is None:
        raise Unsupported(f"'schedule' must be a schedule, not {schedule!r}")
    if isinstance(schedule, (int, float)):
        return _every(timedelta(seconds=schedule))
    if isinstance(schedule, timedelta):
        return _every(schedule)
    if kind == CELERY + "solar":
        raise Unsupported("solar schedules are refused: harvest has no sunrise/sunset ticks")
    if kind not in (CELERY + "schedule", CELERY + "crontab"):
        raise Unsupported(f"custom schedule class {kind} is refused: harvest cannot know its ticks")
    if getattr(schedule, "nowfun", None) is not None:
        raise Unsupported("a schedule with a custom nowfun is refused: ticks follow the database clock")
    if kind == CELERY + "schedule":
        if getattr(schedule, "relative", False):
            raise Unsupported("relative=True is refused: every= is anchored at the Unix epoch")
        return _every(schedule.run_every)
    return _cron(schedule, timezone)


def _every(interval: Any) -> Spec:
    try:
        return Spec.checked(every=interval)
    except InvalidSchedule as exc:
        raise Unsupported(str(exc)) from None


def _cron(crontab: Any, timezone: str) -> Spec:
    fields = [_field(set(getattr(crontab, n)), lo, hi) for n, lo, hi in FIELDS]
    fields.append(_field(set(crontab.day_of_week), 0, 6))
    if fields[2] != "*" and fields[4] != "*":
        raise Unsupported(
            "a crontab restricting both day_of_month and day_of_week is refused: Celery fires on "
            "days matching both, cron on days matching either"
        )
    expression = " ".join(fields)
    try:
        return Spec.checked(cron=expression, timezone=timezone)
    except InvalidSchedule as exc:
        raise Unsupported(f"crontab as {expression!r} in {timezone}: {exc}") from None


def _field(values: set[int], lo: int, hi: int) -> str:
    """A cron field for a crontab's expanded set: ``*``, ``*/step`` or ranges and values (the
    same set either way; cron's OR of the two day fields is excluded by the caller)."""
    vs = sorted(values)
    if not vs or vs[0] < lo or vs[-1] > hi:
        raise Unsupported(f"a crontab field {vs} is outside {lo}-{hi}")
    if vs == list(range(lo, hi + 1)):
        return "*"
    step = vs[1] - vs[0] if len(vs) > 1 else 0
    if step > 1 and (hi + 1 - lo) % step == 0 and vs == list(range(lo, hi + 1, step)):
        return f"*/{step}"  # only a step that divides the field's range: */45 reads as 0,45
    parts, i = [], 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if j == i else f"{vs[i]}-{vs[j]}" if j > i + 1 else f"{vs[i]},{vs[j]}")
        i = j + 1
    return ",".join(parts)


def convert_all(entries: Mapping[Any, Any], timezone: str) -> tuple[list[BeatEntry], dict[str, str]]:
    """Every entry converted (in name order), and the refused ones by name with why."""
    converted: list[BeatEntry] = []
    refused: dict[str, str] = {}
    for name in sorted(entries, key=str):
        try:
            converted.append(convert(name, entries[name], timezone))
        except Unsupported as exc:
            refused[str(name)] = str(exc)
    return converted, refused
