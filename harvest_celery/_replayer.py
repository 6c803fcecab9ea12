"""``WorkflowReplayer``: replay stored histories against the current code — the pre-deploy check.

A replay is a pure read. Each history goes through the engine's probe replay
(``replay_history``), which appends nothing, records no marker and counts nothing; this module
reads histories through the ``Store`` (or from files written by :func:`export_run`) and never
writes to the database.

The verdict for one run:

* **diverged** — the current code issues a command the history does not hold at that point
  (``NonDeterministic``: ``expected X, got Y`` at event N; "expected" is what the code issues,
  "got" what the history recorded), drops a recorded command, or issues a new command after a
  run that closed by itself (completed or failed: a closed run has no live frontier).
* **ok** — everything else. New commands at the live frontier of an open run are what its next
  decision will append, not drift; the same holds for a run that an operator terminated (no
  workflow code ran at its end). A cancelled run is sealed: the engine raises a divergence into
  the workflow instead of recording it (the spec's pinned case: a durable compensation after a
  recorded cancel fails with ``got WorkflowCancelled``), so its post-cancel part is never drift;
  its pre-cancel prefix is replayed on its own as an open run and checked like any other.
* **error** — the history cannot be replayed at all: a payload that cannot be decoded, an event
  type this build does not know, a malformed export, an open run of a workflow the current code
  no longer registers, or an exception the engine raised.
* **skipped** — nothing meaningful to replay: a run whose payloads were erased, or a closed run
  of a workflow type the current code no longer registers.

This module sits at the client layer, beside ``_client`` (it may not import it: a ``Harvest`` is
taken by its attributes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from harvest_celery._core import events as ev
from harvest_celery._core.commands import (
    Command,
    CompleteUpdate,
    RecordMarker,
    ScheduleActivity,
    StartChildWorkflow,
)
from harvest_celery._core.engine import EngineConfig, replay_history
from harvest_celery._core.lifecycle import RUNNING, TERMINAL_STATUSES, TERMINATED
from harvest_celery._core.registry import Registry
from harvest_celery._errors import ExecutionNotFound, HarvestError
from harvest_celery._store.records import utcnow
from harvest_celery._store.store import Store

EXPORT_FORMAT = "harvest-history"
EXPORT_VERSION = 1

OK, DIVERGED, ERROR, SKIPPED = "ok", "diverged", "error", "skipped"
DATABASE = "database"


class AppLike(Protocol):
    """What the replayer needs of a ``Harvest``: its registry, its store, its runtime."""

    registry: Registry
    store: Store
    runtime: Any


@dataclass(frozen=True)
class RunReport:
    """The verdict on one run. ``expected``/``actual``/``event_index`` are set when it diverged
    (``expected``: what the current code issues; ``actual``: what the history holds there);
    ``reason`` when it is an error or was skipped."""

    execution_id: str
    workflow_type: str
    result: str  # ok | diverged | error | skipped
    source: str = DATABASE
    events: int = 0
    expected: str | None = None
    actual: str | None = None
    event_index: int | None = None
    reason: str | None = None

    def line(self) -> str:
        where = "" if self.source == DATABASE else f" [{self.source}]"
        head = (
            f"{self.result.upper():<8} {self.execution_id} ({self.workflow_type or '?'}, "
            f"{self.events} events){where}"
        )
        if self.result == DIVERGED:
            return f"{head}: expected {self.expected}, got {self.actual} at event {self.event_index}"
        return f"{head}: {self.reason}" if self.reason else head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReplayReport:
    """Every run's verdict, in the order replayed."""

    runs: tuple[RunReport, ...] = ()

    def _having(self, result: str) -> list[RunReport]:
        return [r for r in self.runs if r.result == result]

    @property
    def ok(self) -> list[RunReport]:
        return self._having(OK)

    @property
    def diverged(self) -> list[RunReport]:
        return self._having(DIVERGED)

    @property
    def errors(self) -> list[RunReport]:
        return self._having(ERROR)

    @property
    def skipped(self) -> list[RunReport]:
        return self._having(SKIPPED)

    @property
    def passed(self) -> bool:
        """No run diverged and none failed to replay (skipped runs do not count)."""
        return not self.diverged and not self.errors

    def exit_code(self, *, strict: bool = True) -> int:
        """Strict: 1 unless :attr:`passed`. Canary: always 0 (report only)."""
        return 0 if self.passed or not strict else 1

    def summary(self) -> str:
        runs = "run" if len(self.runs) == 1 else "runs"
        return (
            f"replayed {len(self.runs)} {runs}: {len(self.ok)} ok, {len(self.diverged)} diverged, "
            f"{len(self.errors)} errors, {len(self.skipped)} skipped"
        )

    def lines(self) -> list[str]:
        return [r.line() for r in self.runs] + [self.summary()]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "summary": self.summary(), "runs": [r.to_dict() for r in self.runs]}


@dataclass(frozen=True)
class RecordedRun:
    """A history to replay, from the database or an export file."""

    execution_id: str
    workflow_type: str
    history: list[ev.HistoryEvent]
    status: str | None = None
    erased: bool = False
    source: str = DATABASE


class WorkflowReplayer:
    """Replay stored histories against the workflows registered now.

    ``WorkflowReplayer(harvest)`` reads runs through the app's store (its codec and payload store
    decode them) and uses its engine configuration; ``WorkflowReplayer(registry)`` replays
    histories given in memory or in export files only (pass ``store=`` to read a database)."""

    def __init__(
        self, app: AppLike | Registry, *, store: Store | None = None, config: EngineConfig | None = None
    ) -> None:
        if isinstance(app, Registry):
            self.registry = app
            self.store = store
            self.config = config or EngineConfig()
        else:
            self.registry = app.registry
            self.store = store or app.store
            self.config = config or app.runtime.settings.engine

    # ── sources ──────────────────────────────────────────────────────────────────────────────
    def replay_database(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        ids: Sequence[str] = (),
        limit: int = 100,
    ) -> ReplayReport:
        """Replay stored runs: those of ``ids`` (each narrowed by ``workflow``/``status`` when
        given), else the newest ``limit`` runs matching ``workflow`` and ``status``."""
        store = self._store()
        if ids:
            reports = []
            for execution_id in dict.fromkeys(ids):
                try:
                    row = store.get(execution_id)
                except ExecutionNotFound as exc:
                    reports.append(RunReport(execution_id, "", ERROR, reason=str(exc)))
                    continue
                if (workflow and row.workflow_type != workflow) or (status and row.status != status):
                    continue
                reports.append(
                    self._replay_stored(row.id, row.workflow_type, row.status, row.erased_at is not None)
                )
            return ReplayReport(tuple(reports))
        if limit < 1:
            raise ValueError("limit must be at least 1")
        rows = store.list(status=status, workflow_type=workflow, limit=limit)
        return ReplayReport(
            tuple(self._replay_stored(r.id, r.workflow_type, r.status, r.erased_at is not None) for r in rows)
        )

    def replay_files(self, paths: Iterable[str | os.PathLike[str]]) -> ReplayReport:
        """Replay the runs of export files (each holds one export, or a JSON list of them)."""
        reports: list[RunReport] = []
        for path in paths:
            for item in load_exports(path):
                reports.append(item if isinstance(item, RunReport) else self.replay(item))
        return ReplayReport(tuple(reports))

    def replay_history(
        self,
        workflow_type: str,
        history: list[ev.HistoryEvent],
        *,
        execution_id: str = "replay",
        status: str | None = None,
    ) -> RunReport:
        """Replay one history held in memory."""
        return self.replay(RecordedRun(execution_id, workflow_type, list(history), status, source="memory"))

    def export(self, execution_id: str) -> dict[str, Any]:
        """The run as an export document (decoded payloads): see :func:`export_run`."""
        return export_run(self._store(), execution_id)

    def _store(self) -> Store:
        if self.store is None:
            raise ValueError("this replayer has no store: build it with a Harvest, or pass store=")
        return self.store

    def _replay_stored(self, execution_id: str, workflow_type: str, status: str, erased: bool) -> RunReport:
        if erased:
            return RunReport(
                execution_id, workflow_type, SKIPPED, reason="payloads erased: nothing meaningful to replay"
            )
        try:
            history = self._store().history(execution_id, strict=True)
        except HarvestError as exc:  # a payload that cannot be decoded, an unknown event type
            return RunReport(execution_id, workflow_type, ERROR, reason=_error_text(exc))
        return self.replay(RecordedRun(execution_id, workflow_type, history, status))

    # ── the verdict ──────────────────────────────────────────────────────────────────────────
    def replay(self, run: RecordedRun) -> RunReport:
        """Replay one recorded run against the current code and judge it (never raises for
        anything the history or the workflow code does)."""
        base = RunReport(run.execution_id, run.workflow_type, OK, run.source, len(run.history))
        if run.erased:
            return _with(base, SKIPPED, reason="payloads erased: nothing meaningful to replay")
        problem = _shape_problem(run)
        if problem:
            return _with(base, ERROR, reason=problem)
        if not self.registry.has_workflow(run.workflow_type):
            if _closed(run):
                return _with(base, SKIPPED, reason="a closed run of a workflow no longer registered")
            return _with(
                base,
                ERROR,
                reason=f"workflow {run.workflow_type!r} is not registered: "
                "this open run could not be decided after the deploy",
            )
        try:
            return self._judge(base, run)
        except Exception as exc:  # noqa: BLE001 - the engine refused this history: an error, not a crash
            return _with(base, ERROR, reason=_error_text(exc))

    def _judge(self, base: RunReport, run: RecordedRun) -> RunReport:
        definition = self.registry.workflow(run.workflow_type)
        history = run.history
        decision = replay_history(definition, run.execution_id, history, self.registry, self.config)
        if decision.nd is not None:
            return _diverged(base, decision.nd)
        cancel = next((i for i, h in enumerate(history) if isinstance(h.event, ev.WorkflowCancelled)), None)
        if cancel is not None:
            # Sealed: divergences after the cancel are raised into the workflow, never recorded
            # (the spec's pinned case). What came before the cancel is checked as an open run.
            before = replay_history(
                definition, run.execution_id, history[:cancel], self.registry, self.config
            )
            return _diverged(base, before.nd) if before.nd is not None else base
        terminal = _terminal_index(history)
        if terminal is not None and decision.commands and not _terminated(run):
            return _with(
                base,
                DIVERGED,
                expected=_describe(decision.commands[0]),
                actual=history[terminal].describe(),
                event_index=terminal,
            )
        return base


# ── export files ─────────────────────────────────────────────────────────────────────────────
def export_run(store: Store, execution_id: str) -> dict[str, Any]:
    """One run as a JSON-able document: its id, workflow type, status and every event (``seq``,
    ``type``, ``data``, ``recorded_at``). Payloads are **decoded** (decrypted, inflated): an
    export holds the run's inputs and outputs in clear — treat the file like the data itself."""
    row = store.get(execution_id)
    history = store.history(execution_id, strict=True)
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "execution_id": row.id,
        "workflow_type": row.workflow_type,
        "status": row.status,
        "erased": row.erased_at is not None,
        "exported_at": utcnow().isoformat(),
        "events": [
            {
                "seq": h.seq,
                "type": h.event.type,
                "data": h.event.to_data(),
                "recorded_at": h.recorded_at.isoformat(),
            }
            for h in history
        ],
    }


def write_export(document: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write an export readable by its owner only (it holds decoded payloads)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=1, ensure_ascii=False)
        out.write("\n")


def load_exports(path: str | os.PathLike[str]) -> list[RecordedRun | RunReport]:
    """The runs of one export file; a run (or a file) that cannot be read is an error report."""
    source = str(path)
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [RunReport(Path(path).name, "", ERROR, source, reason=f"cannot read the file: {exc}")]
    documents = document if isinstance(document, list) else [document]
    out: list[RecordedRun | RunReport] = []
    for i, doc in enumerate(documents):
        name = str(doc.get("execution_id") or f"{Path(path).name}#{i}") if isinstance(doc, dict) else f"#{i}"
        try:
            out.append(_from_export(doc, source))
        except (HarvestError, ValueError, TypeError, KeyError, AttributeError) as exc:
            workflow_type = doc.get("workflow_type", "") if isinstance(doc, dict) else ""
            out.append(
                RunReport(
                    name,
                    str(workflow_type or ""),
                    ERROR,
                    source,
                    reason=f"cannot load the export: {_error_text(exc)}",
                )
            )
    return out


def _from_export(doc: Any, source: str) -> RecordedRun:
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise ValueError(f'not a harvest export (no "format": "{EXPORT_FORMAT}")')
    if doc.get("version") != EXPORT_VERSION:
        raise ValueError(
            f"export version {doc.get('version')!r} is not supported "
            f"(this build reads version {EXPORT_VERSION})"
        )
    items = doc["events"]
    if not isinstance(items, list):
        raise ValueError('"events" is not a list')
    history = []
    for i, item in enumerate(items):
        data = dict(item["data"])
        kind = item.get("type", data.get("type"))
        if data.get("type", kind) != kind:
            raise ValueError(f"event {i}: type {kind!r} but data of type {data.get('type')!r}")
        if item["seq"] != i:
            raise ValueError(f"event {i} has seq {item['seq']!r}: seqs must run 0, 1, 2, ...")
        data["type"] = kind
        history.append(ev.HistoryEvent(i, ev.event_from_data(data), _parse_time(item["recorded_at"])))
    return RecordedRun(
        str(doc["execution_id"]),
        str(doc["workflow_type"]),
        history,
        doc.get("status"),
        bool(doc.get("erased")),
        source,
    )


def _parse_time(text: Any) -> datetime:
    at = datetime.fromisoformat(str(text))
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


# ── helpers ──────────────────────────────────────────────────────────────────────────────────
def _shape_problem(run: RecordedRun) -> str | None:
    if not run.history:
        return "the history is empty"
    started = run.history[0].event
    if not isinstance(started, ev.WorkflowStarted):
        return f"the history starts with {run.history[0].describe()}, not WorkflowStarted"
    if started.workflow_type != run.workflow_type:
        return f"the history was started as {started.workflow_type!r}, not {run.workflow_type!r}"
    return None


def _terminal_index(history: Sequence[ev.HistoryEvent]) -> int | None:
    return next((i for i, h in enumerate(history) if isinstance(h.event, ev.TERMINAL_EVENTS)), None)


def _closed(run: RecordedRun) -> bool:
    """No decision will run again: a terminal status, or (status unknown) an outcome or a cancel
    recorded."""
    if run.status is not None:
        return run.status in TERMINAL_STATUSES
    return _terminal_index(run.history) is not None or any(
        isinstance(h.event, ev.WorkflowCancelled) for h in run.history
    )


def _terminated(run: RecordedRun) -> bool:
    """Sealed by ``terminate`` (no workflow code ran at its end): its frontier stays live."""
    if run.status is not None and run.status != RUNNING:
        return run.status == TERMINATED
    terminal = _terminal_index(run.history)
    event = run.history[terminal].event if terminal is not None else None
    return isinstance(event, ev.WorkflowFailed) and event.error_type == "Terminated"


def _describe(command: Command) -> str:
    if isinstance(command, ScheduleActivity):
        return f"ActivityScheduled({command.activity_name})"
    if isinstance(command, RecordMarker):
        return f"MarkerRecorded({command.name})"
    if isinstance(command, StartChildWorkflow):
        return f"ChildWorkflowScheduled({command.workflow_type})"
    if isinstance(command, CompleteUpdate):
        return f"UpdateCompleted({command.update_id})"
    return f"TimerStarted({command.timer_id})"


def _diverged(base: RunReport, nd: dict[str, Any]) -> RunReport:
    return _with(
        base,
        DIVERGED,
        expected=str(nd.get("expected")),
        actual=str(nd.get("actual")),
        event_index=nd.get("event_index"),
    )


def _with(base: RunReport, result: str, **fields: Any) -> RunReport:
    return RunReport(**{**asdict(base), "result": result, **fields})


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "RecordedRun",
    "ReplayReport",
    "RunReport",
    "WorkflowReplayer",
    "export_run",
    "load_exports",
    "write_export",
]
