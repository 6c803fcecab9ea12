"""Schedules as pure values: the spec, its nominal ticks, their ids and their jitter.

Nominal ticks are a pure function of the spec, the time zone and the anchor, so every scheduler
computes the same instants: ``every`` is anchored at the Unix epoch (``every=1h`` fires on the
hour, and a recreated schedule keeps its ids), ``cron`` follows ``_core.cron``. Jitter is taken
from a hash of the tick id: it delays firing only and is never part of the id or of
``scheduled_for``. Pure: stdlib and the cron wrapper only.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from harvest_celery._core.cron import Cron, CronError
from harvest_celery._core.ids import check_execution_id
from harvest_celery._errors import InvalidExecutionId, InvalidSchedule

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_NAME_LENGTH = 180  # + "@20261201T020000Z" fits the 200-character id cap
OVERLAP = ("skip", "buffer_one", "allow_all")
JITTER_SAMPLE = 1000  # a cron's shortest gap is taken over its next 1,000 ticks
# A tick fired this late is still on time whatever the catch-up window: the latency of a live
# scheduler's own loop. Later than max(window, this) and it is counted missed. How late is judged
# from when the pass that fires it began (``plan``'s ``seen``): a burst of due schedules takes a
# live pass longer than this to work through, and none of its ticks is missed for that.
ON_TIME = timedelta(seconds=5)


ScheduleSpecError = InvalidSchedule


def check_name(name: Any) -> str:
    """A schedule name obeys the execution-id rules and has at most 180 characters."""
    try:
        check_execution_id(name)
    except InvalidExecutionId as exc:
        raise ScheduleSpecError(f"schedule name {name!r}: {exc}") from None
    if len(name) > MAX_NAME_LENGTH:
        raise ScheduleSpecError(f"a schedule name has at most {MAX_NAME_LENGTH} characters, not {len(name)}")
    return name


def zone_of(name: Any) -> ZoneInfo:
    """An IANA ``Area/City`` name, or ``UTC``."""
    if not isinstance(name, str) or not (name == "UTC" or "/" in name) or name.startswith("/"):
        raise ScheduleSpecError(f"unknown timezone {name!r}: give an IANA Area/City name, or UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleSpecError(f"unknown timezone {name!r}: give an IANA Area/City name, or UTC") from None


MAX_SECONDS = 2**31 - 1  # about 68 years: an interval, a window or a jitter fits a 32-bit column


def seconds_of(value: Any, what: str) -> float:
    """A duration given as a ``timedelta`` or as seconds, finite and at most ``MAX_SECONDS``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ScheduleSpecError(f"{what} is a timedelta, not {type(value).__name__}")
    if not math.isfinite(seconds) or abs(seconds) > MAX_SECONDS:
        raise ScheduleSpecError(f"{what} must be a finite duration of at most {MAX_SECONDS}s, not {seconds}s")
    return seconds


@dataclass(frozen=True)
class Spec:
    """When a schedule fires. Exactly one of ``cron`` and ``every`` (whole seconds)."""

    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"
    jitter: float = 0.0  # seconds

    @staticmethod
    def checked(cron: Any = None, every: Any = None, timezone: Any = None, jitter: Any = None) -> Spec:
        if (cron is None) == (every is None):
            raise ScheduleSpecError("give exactly one of cron= and every=")
        jitter_s = 0.0 if jitter is None else seconds_of(jitter, "jitter")
        if jitter_s < 0:
            raise ScheduleSpecError(f"jitter may not be negative ({jitter_s}s)")
        if every is not None:
            if timezone is not None:
                raise ScheduleSpecError("timezone applies to cron; every= is anchored at the Unix epoch")
            seconds = seconds_of(every, "every")
            if seconds < 1 or seconds != math.floor(seconds):
                raise ScheduleSpecError(
                    f"every must be whole seconds, at least 1s (tick ids have second resolution), not {seconds}s"
                )
            spec = Spec(every=int(seconds), jitter=jitter_s)
        else:
            zone = "UTC" if timezone is None else timezone
            zone_of(zone)
            try:
                expression = Cron(cron, zone_of(zone)).expression
            except CronError as exc:
                raise ScheduleSpecError(str(exc)) from None
            spec = Spec(cron=expression, timezone=zone, jitter=jitter_s)
        if jitter_s and jitter_s >= spec.shortest_gap():
            raise ScheduleSpecError(
                f"jitter ({jitter_s}s) must be shorter than the interval ({spec.shortest_gap()}s)"
            )
        return spec

    def _cron(self) -> Cron:
        assert self.cron is not None
        return Cron(self.cron, zone_of(self.timezone))

    def after(self, instant: datetime) -> datetime:
        """The first nominal tick strictly after ``instant`` (aware), in UTC."""
        if self.every is not None:
            elapsed = math.floor((instant - EPOCH).total_seconds())
            return EPOCH + timedelta(seconds=(elapsed // self.every + 1) * self.every)
        return self._cron().after(instant)

    def ticks(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """The nominal ticks in ``(after, until]``, oldest first."""
        cron = self._cron() if self.cron is not None else None
        tick = self.after(after)
        while tick <= until:
            yield tick
            tick = cron.after(tick) if cron is not None else tick + timedelta(seconds=self.every or 0)

    def shortest_gap(self) -> float:
        if self.every is not None:
            return float(self.every)
        cron = self._cron()
        tick = cron.after(datetime(2026, 1, 1, tzinfo=UTC))
        gap = math.inf
        for _ in range(JITTER_SAMPLE):
            following = cron.after(tick)
            gap = min(gap, (following - tick).total_seconds())
            tick = following
        return gap


def tick_id(name: str, tick: datetime) -> str:
    """``nightly-report@20261201T020000Z``: the run id of a nominal tick."""
    return f"{name}@{tick.astimezone(UTC):%Y%m%dT%H%M%SZ}"


def manual_id(name: str, token: str | None = None) -> str:
    """``nightly-report@manual-1a2b3c4d``: never a nominal tick's id."""
    return f"{name}@manual-{token or secrets.token_hex(4)}"


def jitter_of(run_id: str, jitter: float) -> timedelta:
    """The deterministic delay of one tick: every scheduler computes the same one."""
    if jitter <= 0:
        return timedelta(0)
    digest = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big")
    return timedelta(milliseconds=digest % max(1, int(jitter * 1000)))


def fire_at(name: str, tick: datetime, jitter: float) -> datetime:
    return tick + jitter_of(tick_id(name, tick), jitter)


def in_window(
    fire_time: datetime, now: datetime, catchup_window: float, seen: datetime | None = None
) -> bool:
    """Is a tick whose fire time was ``fire_time`` still to fire at ``now``, by a pass that
    began at ``seen`` (default ``now``)? Judged by how long it was due when the pass began: a
    tick that fell due during the pass is on time however many rows the pass fired first."""
    judged = now if seen is None else min(now, max(seen, fire_time))
    return judged - fire_time <= max(timedelta(seconds=catchup_window), ON_TIME)


@dataclass
class Plan:
    """What one firing pass of one schedule does, decided under its row lock."""

    fire: list[datetime] = field(default_factory=list)  # nominal ticks to start, oldest first
    skipped: int = 0
    missed: int = 0
    buffered: datetime | None = None  # the tick held for buffer_one after this pass
    last_tick: datetime | None = None  # the newest tick this pass considered (the cursor)
    next_tick: datetime | None = None  # None: the schedule has ended
    lateness: list[float] = field(default_factory=list)  # seconds, per fired tick


MAX_TICKS_PER_PASS = 100_000  # a long outage of a minutely cron: the rest on the next pass


def plan(
    spec: Spec,
    name: str,
    *,
    last_tick: datetime,
    now: datetime,
    open_run: bool,
    buffered: datetime | None,
    overlap: str,
    catchup_window: float,
    runs: int,
    max_runs: int | None,
    end_at: datetime | None,
    seen: datetime | None = None,
) -> Plan:
    """The semantics table of docs/schedules.md, as one pure function: the due ticks after
    ``last_tick`` (those whose jittered fire time is not after ``now``) oldest first, each
    missed (older than the window), fired or skipped (or buffered) by the overlap policy;
    ``runs`` counts the nominal ticks fired so far (``max_runs``), ``end_at`` bounds the ticks.
    ``seen``: when the firing pass began (``in_window``)."""
    out = Plan(buffered=buffered, last_tick=last_tick)
    busy = open_run

    def room() -> bool:
        return max_runs is None or runs + len(out.fire) < max_runs

    def fire(tick: datetime) -> None:
        out.fire.append(tick)
        out.lateness.append((now - tick).total_seconds())

    if out.buffered is not None and not busy:
        if room():
            fire(out.buffered)
            busy = True
        out.buffered = None
    for count, tick in enumerate(spec.ticks(last_tick, now)):
        if count >= MAX_TICKS_PER_PASS or fire_at(name, tick, spec.jitter) > now:
            break
        if (end_at is not None and tick > end_at) or not room():
            break
        out.last_tick = tick
        if not in_window(fire_at(name, tick, spec.jitter), now, catchup_window, seen):
            out.missed += 1
        elif overlap == "allow_all" or not busy:
            fire(tick)
            busy = True
        elif overlap == "buffer_one" and out.buffered is None:
            out.buffered = tick
        else:
            out.skipped += 1
    following = spec.after(out.last_tick or last_tick)
    ended = (end_at is not None and following > end_at) or not room()
    out.next_tick = None if ended and out.buffered is None else following
    return out
