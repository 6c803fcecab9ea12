"""Human-readable views of a run: the status block and the history timeline.

Pure functions over an ``Execution`` and a ``list[HistoryEvent]``, shared by ``harvest show`` and
``harvest demo``. Output is plain ASCII so it survives any terminal encoding.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import display_status

MAX_VALUE = 60  # characters of a payload shown inline


def short(value: Any, limit: int = MAX_VALUE) -> str:
    """Compact JSON of ``value``, cut at ``limit`` characters."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _offset(at: datetime, start: datetime) -> str:
    return f"+{(at - start).total_seconds():.3f}s"


def render_timeline(history: list[ev.HistoryEvent], errors: Sequence[Any] = ()) -> list[str]:
    """One line per event: seq, time since the first event, kind and its key fields.

    ``errors`` are the run's failed attempts (``AttemptError`` records, ``Store.attempt_errors``).
    The history holds only an activity's last failure (``ActivityFailed``); an attempt that failed
    and was retried gets a line of its own, ``(attempt failed)`` and no seq, after its
    ``ActivityStarted`` and where its time falls, so a retry never shows two starts with nothing
    between."""
    if not history:
        return ["  (no events)"]
    start = history[0].recorded_at
    names: dict[str, str] = {}  # activity id -> activity name, learnt from ActivityScheduled
    rows: list[tuple[str, datetime, str, str]] = []
    for item in history:
        event = item.event
        if isinstance(event, ev.ActivityScheduled):
            names[event.activity_id] = event.activity_name
        rows.append((str(item.seq), item.recorded_at, event.type, _detail(ev.known(event), names)))
    for at, error in reversed(_retried_failures(history, errors)):
        detail = f"{_activity(error.activity_id, names)} attempt={error.attempt} {error.error_type}: "
        rows.insert(at, ("", error.recorded_at, "(attempt failed)", detail + _cut(error.message, MAX_VALUE)))
    seq_width = len(str(history[-1].seq))
    offsets = [_offset(at, start) for _, at, _, _ in rows]
    offset_width = max(len(o) for o in offsets)
    lines = []
    for (seq, _, kind, detail), offset in zip(rows, offsets, strict=True):
        lines.append(f"  {seq:>{seq_width}}  {offset:>{offset_width}}  {kind:<18} {detail}".rstrip())
    return lines


def _retried_failures(history: list[ev.HistoryEvent], errors: Sequence[Any]) -> list[tuple[int, Any]]:
    """(index in ``history`` to insert before, error) for each failed attempt the history does not
    record, in order: after its attempt's ``ActivityStarted`` and after every event recorded no
    later than the failure."""
    recorded = {
        (e.activity_id, e.attempt) for e in (h.event for h in history) if isinstance(e, ev.ActivityFailed)
    }
    started = {
        (h.event.activity_id, h.event.attempt): i
        for i, h in enumerate(history)
        if isinstance(h.event, ev.ActivityStarted)
    }
    out = []
    for error in errors:
        key = (error.activity_id, error.attempt)
        if not error.activity_id or key in recorded:
            continue
        at = started.get(key, -1) + 1
        while at < len(history) and history[at].recorded_at <= error.recorded_at:
            at += 1
        out.append((at, error))
    return sorted(out, key=lambda pair: pair[0])


def _activity(activity_id: str, names: dict[str, str]) -> str:
    name = names.get(activity_id)
    return f"{name} #{activity_id}" if name else f"activity #{activity_id}"


def _detail(event: ev.AnyEvent, names: dict[str, str]) -> str:
    match event:
        case ev.WorkflowStarted():
            return f"{event.workflow_type} input={short(event.input)}"
        case ev.ActivityScheduled():
            text = f"{_activity(event.activity_id, names)} queue={event.queue or '-'}"
            return text + (" (compensation)" if event.compensation else "")
        case ev.ActivityStarted():
            return f"{_activity(event.activity_id, names)} attempt={event.attempt} worker={event.worker_id}"
        case ev.ActivityCompleted():
            return f"{_activity(event.activity_id, names)} attempt={event.attempt} -> {short(event.output)}"
        case ev.ActivityFailed():
            return (
                f"{_activity(event.activity_id, names)} attempt={event.attempt} "
                f"{event.error_type}: {_cut(event.message, MAX_VALUE)}"
            )
        case ev.MarkerRecorded():
            return event.name if event.details is None else f"{event.name} {short(event.details)}"
        case ev.SignalReceived():
            return event.name if event.payload is None else f"{event.name} payload={short(event.payload)}"
        case ev.TimerStarted():
            return f"timer #{event.timer_id} {event.seconds:g}s (fires {event.fire_at})"
        case ev.TimerFired():
            return f"timer #{event.timer_id}"
        case ev.WorkflowCancelled() | ev.WorkflowCancelRequested():
            return f"reason={short(event.reason)}" if event.reason else ""
        case ev.WorkflowTimeoutRequested():
            return f"{event.timeout} reason={short(event.reason)}"
        case ev.WorkflowCompleted():
            return f"-> {short(event.result)}"
        case ev.WorkflowFailed():
            return f"{event.error_type}: {_cut(event.message, 2 * MAX_VALUE)}"
        case ev.ChildWorkflowScheduled():
            text = (
                f"{event.workflow_type} id={event.child_id} policy={event.policy} input={short(event.input)}"
            )
            return text + (" (compensation)" if event.compensation else "")
        case ev.ChildWorkflowStarted():
            return f"id={event.child_id}"
        case ev.ChildWorkflowStartRefused():
            return f"id={event.child_id} exists ({event.existing_workflow_type or '?'})"
        case ev.ChildWorkflowClosed():
            if event.status == "COMPLETED":
                return f"id={event.child_id} COMPLETED -> {short(event.result)}"
            return f"id={event.child_id} {event.status} {event.error_type}: {_cut(event.message, MAX_VALUE)}"
        case ev.WorkflowContinuedAsNew():
            return f"-> {event.next_id} input={short(event.input)}"
        case ev.UpdateAccepted():
            return f"{event.name} id={event.update_id} arg={short(event.arg)}"
        case ev.UpdateCompleted():
            if event.error_type:
                return f"id={event.update_id} {event.error_type}: {_cut(event.message, MAX_VALUE)}"
            return f"id={event.update_id} -> {short(event.result)}"
        case other:
            ev.unhandled(other)


def _when(at: datetime | None) -> str:
    if at is None:
        return "-"
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + ("Z" if at.utcoffset() is not None else "")


def render_status(execution: Any) -> list[str]:
    """The status block of ``harvest show`` for an ``Execution``."""
    x = execution
    requested = getattr(x, "cancel_requested_at", None)
    waiting = bool(getattr(x, "waiting", False))  # not yet admitted: WAITING, as describe() says
    status = display_status(x.status, x.cancelled_at is not None, requested is not None, x.error, waiting)
    lines = [f"{x.id}  {x.workflow_type}  {status}"]
    created = f"  created   {_when(x.created_at)}"
    if x.closed_at is not None:
        created += f"   closed {_when(x.closed_at)} ({_offset(x.closed_at, x.created_at)})"
    lines.append(created)
    for label, attr in (("parent", "parent_id"), ("from", "continued_from"), ("continued", "continued_to")):
        if getattr(x, attr, None):
            lines.append(f"  {label:<9} {getattr(x, attr)}")
    for child in getattr(x, "children", ()):
        lines.append(f"  child     {child['id']}  {child['workflow']}  {child['status']}")
    if requested is not None:
        reason = "" if x.cancelled_at is not None else f"  reason={short(x.cancel_reason or '')}"
        lines.append(f"  cancel requested {_when(requested)}{reason}")
    if x.cancelled_at is not None:
        lines.append(f"  cancelled {_when(x.cancelled_at)}  reason={short(x.cancel_reason or '')}")
    if x.nd_blocked_at is not None:
        lines.append(
            f"  nd-blocked since {_when(x.nd_blocked_at)} ({x.nd_block_count} attempt(s)): "
            f"{x.nd_block_reason or ''}"
        )
        details = x.nd_details or {}
        if details:
            lines.append(
                "    "
                + ", ".join(
                    f"{k}={details[k]}"
                    for k in ("expected", "actual", "event_index", "workflow_type")
                    if k in details
                )
            )
    if x.error:
        error = x.error if isinstance(x.error, dict) else {"message": x.error}
        lines.append(f"  error     {error.get('type', 'Error')}: {error.get('message', '')}")
    if x.status == "COMPLETED":
        lines.append(f"  result    {short(x.result, 200)}")
    lines.append(f"  events    {x.history_length}")
    return lines


def render_errors(errors: list[Any]) -> list[str]:
    """Every failed attempt (``AttemptError`` records), oldest first, with the innermost frame of
    its traceback and the exception: what ``harvest show`` prints under the timeline."""
    lines = []
    for e in errors:
        who = "workflow" if not e.activity_id else f"activity #{e.activity_id} attempt {e.attempt}"
        lines.append(f"{who}: {e.error_type}: {e.message}")
        lines.extend("    " + line for line in innermost(e.traceback))
    return lines


def innermost(traceback: str) -> list[str]:
    """The innermost frame of a formatted traceback (its ``File`` line, its code and the code's
    ``^^^`` marks) and the exception after it; cut at a frame, never inside one. A text with no
    frame: its last four lines."""
    lines = [line for line in traceback.rstrip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    return lines[frames[-1] :] if frames else lines[-4:]
