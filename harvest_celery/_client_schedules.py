"""``Harvest``'s schedules: durable schedules in Postgres that replace Celery Beat
(docs/schedules.md). A schedule fires only in processes with the decision queue of the
``Harvest`` that created it whose registry has its workflow, or, for a task schedule imported
from Beat (``import_beat``), that adopted its task."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from harvest_celery._client_base import ClientBase
from harvest_celery._core.beat import BeatEntry, BeatImport, beat_schedule_of, convert_all
from harvest_celery._core.invocation import adopted_task_name, invocation
from harvest_celery._core.jsonvalues import check_cap, check_json
from harvest_celery._core.lifecycle import FAILED
from harvest_celery._core.schedule import MAX_SECONDS, OVERLAP, Spec, check_name, manual_id, seconds_of
from harvest_celery._errors import (
    BeatImportRefused,
    HarvestError,
    InvalidLimitKey,
    InvalidSchedule,
    PayloadCodecError,
    PayloadNotSerializable,
)
from harvest_celery._payloads.digest import input_digest
from harvest_celery._runtime import scheduler
from harvest_celery._store import admission
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
        try:  # a limited workflow's key, as its ticks will compute it: refused now, not per tick
            admission.prepare(self.registry, workflow, payload, 0)
        except InvalidLimitKey as exc:
            raise InvalidSchedule(f"input of schedule {name!r}: {exc}") from exc
        values.update(end_at=end, max_runs=max_runs, decision_queue=self.runtime.settings.decision_queue)
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)
            rows.create(tx, values, payload, input_digest(name, payload))

    def _checked(
        self,
        name: str,
        workflow: str | None,
        cron: Any,
        every: Any,
        timezone: Any,
        overlap: Any,
        catchup_window: Any,
        jitter: Any,
    ) -> dict[str, Any]:
        check_name(name)
        if workflow is not None:  # None: a task schedule's edit (its task is not re-checked)
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
            row.workflow if row.target != rows.TASK else None,
            cron if given else row.cron,
            every if given else row.every_seconds,
            timezone if given else (row.timezone if row.cron is not None else None),
            overlap or row.overlap,
            catchup_window if catchup_window is not None else row.catchup_seconds,
            jitter if jitter is not None else row.jitter_seconds,
        )
        with self.store.begin() as tx:
            return rows.edit(tx, name, {k: v for k, v in values.items() if k not in ("name", "workflow")})

    def _admit(self, kind: str, data: Any) -> admission.Prepared:
        """A trigger's or backfill's run passes admission as a tick's does."""
        return admission.prepare(self.registry, kind, data, 0)

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
            run_id = rows.trigger(
                tx, name, manual_id(name), self.runtime.settings.decision_queue, overlap, self._admit
            )
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
                started = rows.backfill_tick(
                    tx, name, tick, self.runtime.settings.decision_queue, self._admit
                )
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

    def import_beat(
        self,
        app_or_beat_schedule: Any,
        *,
        update: bool = False,
        skip_unsupported: bool = False,
        overlap: str = "skip",
    ) -> BeatImport:
        """Import Celery Beat's ``beat_schedule`` (of a Celery app, in its ``timezone`` or UTC,
        or a mapping, in UTC): each entry becomes a schedule of the same name whose every tick
        starts the existing task, as ``start_task(task, *args, id_reuse="use_existing",
        queue=<the entry's queue option>, **kwargs)`` would, with the tick's id (docs/schedules.md,
        "Migrating from Celery Beat"). New schedules take ``overlap`` (default ``skip``; Beat's
        behaviour is ``allow_all``) and no catch-up window.

        An identical schedule is left alone; a changed one is refused unless ``update``. An
        entry harvest cannot honour (solar, ``relative=True``, an option but ``queue``, a custom
        schedule class, a name with ``:`` or ``/``, a task not adopted with ``adopt_task``, a
        name held by a workflow schedule) is refused. Refusals raise ``BeatImportRefused``
        naming each entry with why, and nothing is written, unless ``skip_unsupported`` (then
        the refused entries are skipped and listed in ``refused``; a changed schedule still
        needs ``update``)."""
        if overlap not in OVERLAP:
            raise InvalidSchedule(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")
        entries, timezone = beat_schedule_of(app_or_beat_schedule)
        converted, refused = convert_all(entries, timezone)
        calls = self._beat_calls(converted, refused)
        with self.store.begin() as tx:
            existing = {r.name: r for r in rows.listed(tx)}
        out = BeatImport(refused=refused)
        changed: dict[str, str] = {}
        for entry in converted:
            if entry.name not in calls:
                continue
            row = existing.get(entry.name)
            if row is None:
                out.created.append(entry.name)
            elif row.target != rows.TASK:
                refused[entry.name] = f"the name is taken by a schedule of workflow {row.workflow!r}"
            else:
                diff = _beat_diff(row, entry, calls[entry.name])
                if not diff:
                    out.unchanged.append(entry.name)
                elif update:
                    out.updated.append(entry.name)
                else:
                    changed[entry.name] = (
                        f"changed since it was imported ({diff}): pass update=True (--update)"
                    )
        blocking = {**changed, **({} if skip_unsupported else refused)}
        if blocking:
            raise BeatImportRefused(blocking)
        self._beat_write({e.name: e for e in converted}, calls, out, overlap)
        return out

    def _beat_calls(self, converted: list[BeatEntry], refused: dict[str, str]) -> dict[str, dict[str, Any]]:
        """Each entry's call, checked as ``start_task`` checks it (an adopted task, JSON
        arguments under the cap, an input the codec takes); a refusal goes to ``refused``."""
        engine = self.runtime.settings.engine
        calls = {}
        for entry in converted:
            try:
                adopted_task_name(self.registry, entry.task)
                call = invocation(entry.task, entry.args, entry.kwargs)
                check_cap(
                    call,
                    f"input of activity {entry.task!r}",
                    engine.max_activity_input_bytes,
                    engine.offloads,
                )
                self.store.payloads.codec.encode(call)
            except HarvestError as exc:
                refused[entry.name] = f"{type(exc).__name__}: {exc}"
                continue
            except Exception as exc:  # noqa: BLE001 - a codec's own refusal, one reason
                refused[entry.name] = f"the codec refused the call: {type(exc).__name__}: {exc}"
                continue
            calls[entry.name] = call
        return calls

    def _beat_write(
        self, entries: dict[str, BeatEntry], calls: dict[str, Any], out: BeatImport, overlap: str
    ) -> None:
        """Create and update the imported schedules in one transaction: all or nothing."""
        refs: list[tuple[str, str]] = []
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)
            for name in out.created:
                values = {
                    **_beat_values(entries[name]),
                    "name": name,
                    "jitter_seconds": 0.0,
                    "overlap": overlap,
                    "catchup_seconds": 0.0,
                    "end_at": None,
                    "max_runs": None,
                    "decision_queue": self.runtime.settings.decision_queue,
                    "target": rows.TASK,
                }
                rows.create(tx, values, calls[name], input_digest(name, calls[name]))
            for name in out.updated:
                refs += rows.set_input(tx, name, calls[name], input_digest(name, calls[name]))
                rows.edit(tx, name, _beat_values(entries[name]))
        self.store._delete_blobs(refs, [])

    def fire_schedules(self) -> list[rows.Fired]:
        """One firing pass of this process's schedules (the scheduler loop and the sweeper)."""
        return scheduler.fire_pass(self.runtime)


def _beat_values(entry: BeatEntry) -> dict[str, Any]:
    """The columns an imported entry sets (and an update changes)."""
    return {
        "workflow": entry.task,
        "queue": entry.queue,
        "cron": entry.spec.cron,
        "every_seconds": entry.spec.every,
        "timezone": entry.spec.timezone,
    }


def _beat_diff(row: Any, entry: BeatEntry, call: Any) -> str:
    """What differs between a task schedule and an entry ("" when identical)."""
    diffs = [
        f"{column} {getattr(row, column)!r} -> {value!r}"
        for column, value in _beat_values(entry).items()
        if getattr(row, column) != value
    ]
    if row.input_digest != input_digest(entry.name, call):
        diffs.append("args/kwargs")
    return ", ".join(diffs)


def _view(row: Any, last_status: str | None) -> dict[str, Any]:
    def iso(v: Any) -> str | None:
        return rows.aware(v).isoformat() if v is not None else None

    return {
        "name": row.name,
        "workflow": row.workflow,
        "target": row.target,
        "queue": row.queue,
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
