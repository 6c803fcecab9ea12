"""``Harvest``'s schedules: durable schedules in Postgres that replace Celery Beat
(docs/schedules.md). A schedule fires only in processes with the decision queue of the
``Harvest`` that created it whose registry has its workflow."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from harvest_celery._client_base import ClientBase
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.lifecycle import FAILED
from harvest_celery._core.schedule import MAX_SECONDS, OVERLAP, Spec, check_name, manual_id, seconds_of
from harvest_celery._errors import InvalidSchedule, PayloadCodecError, PayloadNotSerializable
from harvest_celery._payloads.digest import input_digest
from harvest_celery._runtime import scheduler
from harvest_celery._store import schedules as rows
from harvest_celery._store.appconn import payloads_on
from harvest_celery._store.records import utcnow


def _aware(value: Any, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidSchedule(f"{what} is an aware datetime, not {value!r}")
    return value


class Schedules(ClientBase):
    """``Harvest``'s schedules."""

    def create_schedule(
        self,
        name: str,
        *,
        workflow: str,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str | None = None,
        input: Any = None,
        overlap: str = "skip",
        catchup_window: timedelta = timedelta(0),
        jitter: timedelta | None = None,
        end_at: datetime | None = None,
        max_runs: int | None = None,
    ) -> None:
        """Create a durable schedule. Every bad argument raises ``InvalidSchedule`` naming it
        (an unknown workflow, checked against this process's registry, ``UnknownWorkflow``; a
        taken name ``ScheduleAlreadyExists``) and writes nothing."""
        values = self._checked(name, workflow, cron, every, timezone, overlap, catchup_window, jitter)
        end = _aware(end_at, "end_at")
        if end is not None and end <= utcnow():
            raise InvalidSchedule(f"end_at ({end.isoformat()}) is not after now")
        if max_runs is not None and (
            not isinstance(max_runs, int) or isinstance(max_runs, bool) or not 0 < max_runs <= MAX_SECONDS
        ):
            raise InvalidSchedule(f"max_runs must be an integer from 1 to {MAX_SECONDS}, not {max_runs!r}")
        try:
            payload = check_json(input, f"input of schedule {name!r}")
            self.store.payloads.codec.encode(payload)  # a codec that refuses it, before any write
        except (PayloadNotSerializable, PayloadCodecError) as exc:
            raise InvalidSchedule(f"input of schedule {name!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a codec's own refusal, one error type
            raise InvalidSchedule(f"input of schedule {name!r}: {type(exc).__name__}: {exc}") from None
        values.update(end_at=end, max_runs=max_runs, decision_queue=self.runtime.settings.decision_queue)
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)
            rows.create(tx, values, payload, input_digest(name, payload))

    def _checked(
        self,
        name: str,
        workflow: str,
        cron: Any,
        every: Any,
        timezone: Any,
        overlap: Any,
        catchup_window: Any,
        jitter: Any,
    ) -> dict[str, Any]:
        check_name(name)
        self.registry.workflow(workflow)  # UnknownWorkflow against this process's registry
        spec = Spec.checked(cron=cron, every=every, timezone=timezone, jitter=jitter)
        if overlap not in OVERLAP:
            raise InvalidSchedule(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")
        window = seconds_of(catchup_window, "catchup_window")
        if window < 0:
            raise InvalidSchedule(f"catchup_window may not be negative ({window}s)")
        return {
            "name": name,
            "workflow": workflow,
            "cron": spec.cron,
            "every_seconds": spec.every,
            "timezone": spec.timezone,
            "jitter_seconds": spec.jitter,
            "overlap": overlap,
            "catchup_seconds": window,
        }

    def update_schedule(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str | None = None,
        jitter: timedelta | None = None,
        overlap: str | None = None,
        catchup_window: timedelta | None = None,
    ) -> int:
        """Change when a schedule fires (give ``cron`` or ``every``, as at create). Bumps its
        ``spec_version``; no tick of the old spec fires after this returns. Returns the version."""
        with self.store.begin() as tx:
            row = rows.get(tx, name)
        given = cron is not None or every is not None
        values = self._checked(
            name,
            row.workflow,
            cron if given else row.cron,
            every if given else row.every_seconds,
            timezone if given else (row.timezone if row.cron is not None else None),
            overlap or row.overlap,
            catchup_window if catchup_window is not None else row.catchup_seconds,
            jitter if jitter is not None else row.jitter_seconds,
        )
        with self.store.begin() as tx:
            return rows.edit(tx, name, {k: v for k, v in values.items() if k not in ("name", "workflow")})

    def pause_schedule(self, name: str, note: str = "") -> None:
        with self.store.begin() as tx:
            rows.pause(tx, name, note)

    def resume_schedule(self, name: str) -> int:
        """Unpause; returns how many ticks fell while paused (counted skipped, not caught up)."""
        with self.store.begin() as tx:
            return rows.resume(tx, name)

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule with its input (and any offloaded blob) in the same pass."""
        with self.store.begin() as tx:
            refs = rows.delete(tx, name)
        self.store._delete_blobs(refs, [])

    def trigger_schedule(self, name: str, *, overlap: str | None = None) -> str | None:
        """Start a run now (``<name>@manual-<8 hex>``) under the overlap policy, or ``overlap``
        (``"allow_all"`` forces it). Returns the run id, or None when the policy skipped it."""
        if overlap is not None and overlap not in OVERLAP:
            raise InvalidSchedule(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)
            run_id = rows.trigger(tx, name, manual_id(name), self.runtime.settings.decision_queue, overlap)
        self._after(tx)
        return run_id

    def backfill_schedule(self, name: str, start: datetime, end: datetime) -> dict[str, list[str]]:
        """Start the nominal ticks in ``[start, end]`` (``end`` at or before the schedule's
        ``last_tick``: future ticks belong to the schedule), one transaction each, each moving
        the backfill's own cursor: a backfill killed mid-way and asked again for the same range
        resumes after its cursor. A run that still exists answers ("already_ran"); a purged one
        runs again."""
        start_at, end_at = _aware(start, "start"), _aware(end, "end")
        assert start_at is not None and end_at is not None
        with self.store.begin() as tx:
            row = rows.get(tx, name)
        if end_at > rows.aware(row.last_tick):
            raise InvalidSchedule(
                f"a backfill must end at or before the schedule's last tick ({row.last_tick})"
            )
        out: dict[str, list[str]] = {"started": [], "already_ran": []}
        with self.store.begin() as tx:
            cursor = rows.backfill_begin(tx, name, start_at, end_at)
        for tick in rows.spec_of(row).ticks(cursor, end_at):
            with self.store.begin() as tx:
                tx.payloads = payloads_on(self.store, tx.conn)
                started = rows.backfill_tick(tx, name, tick, self.runtime.settings.decision_queue)
            self._after(tx)
            out["started" if started else "already_ran"].append(rows.tick_id(name, tick))
        with self.store.begin() as tx:
            rows.backfill_end(tx, name)
        return out

    def list_schedules(self) -> list[dict[str, Any]]:
        with self.store.begin() as tx:
            found = rows.listed(tx)
            statuses = rows.run_statuses(tx, [r.last_run_id for r in found if r.last_run_id])
        return [_view(r, statuses.get(r.last_run_id)) for r in found]

    def describe_schedule(self, name: str) -> dict[str, Any]:
        with self.store.begin() as tx:
            row = rows.get(tx, name)
            status = rows.run_statuses(tx, [row.last_run_id] if row.last_run_id else []).get(row.last_run_id)
        return _view(row, status)

    def schedule_runs(self, name: str, limit: int = 10) -> list[tuple[str, str]]:
        """The schedule's latest runs, newest first: (run id, status)."""
        with self.store.begin() as tx:
            return [(r.id, r.status) for r in rows.recent_runs(tx, name, limit)]

    def fire_schedules(self) -> list[rows.Fired]:
        """One firing pass of this process's schedules (the scheduler loop and the sweeper)."""
        return scheduler.fire_pass(self.runtime)


def _view(row: Any, last_status: str | None) -> dict[str, Any]:
    def iso(v: Any) -> str | None:
        return rows.aware(v).isoformat() if v is not None else None

    return {
        "name": row.name,
        "workflow": row.workflow,
        "cron": row.cron,
        "every_seconds": row.every_seconds,
        "timezone": row.timezone,
        "overlap": row.overlap,
        "catchup_seconds": row.catchup_seconds,
        "jitter_seconds": row.jitter_seconds,
        "end_at": iso(row.end_at),
        "max_runs": row.max_runs,
        "paused": row.paused,
        "pause_note": row.pause_note,
        "spec_version": row.spec_version,
        "last_tick": iso(row.last_tick),
        "next_fire_at": iso(row.next_fire_at),
        "ended": row.next_fire_at is None and row.buffered_tick is None,
        "buffered_tick": iso(row.buffered_tick),
        "last_run_id": row.last_run_id,
        "last_run_status": last_status,
        "failing": last_status == FAILED,
        "runs": row.runs,
        "fired": row.fired,
        "skipped": row.skipped,
        "missed": row.missed,
    }
