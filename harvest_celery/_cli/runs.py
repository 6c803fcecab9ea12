"""The commands about runs: start, show, list, result, query, update, signal, cancel, request-cancel."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from harvest_celery._cli.common import PROG, CliError, Command, harvest_of, load_app, parse_json, store_of
from harvest_celery._client import Harvest
from harvest_celery._core.admission import admission_text
from harvest_celery._core.limits import slot_text
from harvest_celery._core.timeline import render_errors, render_status, render_timeline
from harvest_celery._errors import WorkflowCancelledError, WorkflowFailed, WorkflowTimedOut
from harvest_celery._store.store import Store


def run_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """start, show, list, result, query, update, cancel, request-cancel, signal."""
    s = command("start", help="start a workflow run; prints its id")
    s.add_argument("workflow")
    s.add_argument("input", nargs="?", default=None, metavar="INPUT_JSON")
    s.add_argument("--id", dest="execution_id", default=None, help="execution id (idempotent start)")
    s.add_argument(
        "--wait", type=float, default=None, metavar="SECONDS", help="wait this long for the result"
    )
    s.add_argument(
        "--execution-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="deadline of the whole execution (spans a continue-as-new chain)",
    )
    s.add_argument("--run-timeout", type=float, default=None, metavar="SECONDS", help="deadline of each run")
    s.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="0-9",
        help="start priority, 9 first (docs/flow-control.md)",
    )
    s.set_defaults(handler=cmd_start)

    sh = command("show", help="status and history timeline of a run")
    sh.add_argument("execution_id", metavar="ID")
    sh.set_defaults(handler=cmd_show)

    ls = command("list", help="list runs, newest first")
    ls.add_argument("--status", default=None, type=str.upper)
    ls.add_argument("--workflow", default=None)
    ls.add_argument("--nd-blocked", action="store_true", help="only runs blocked on a replay divergence")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(handler=cmd_list)

    r = command("result", help="wait for a run and print its result as JSON")
    r.add_argument("execution_id", metavar="ID")
    r.add_argument("--timeout", type=float, default=30.0)
    r.set_defaults(handler=cmd_result)

    q = command("query", help="ask a run's query handler; prints its answer as JSON (writes nothing)")
    q.add_argument("execution_id", metavar="ID")
    q.add_argument("name", metavar="NAME")
    q.add_argument("arg", nargs="?", default=None, metavar="ARG_JSON")
    q.set_defaults(handler=cmd_query)

    u = command("update", help="send a validated update to a live run; prints its handler's result as JSON")
    u.add_argument("execution_id", metavar="ID")
    u.add_argument("name", metavar="NAME")
    u.add_argument("arg", nargs="?", default=None, metavar="ARG_JSON")
    u.add_argument("--update-id", default=None, help="idempotency key: the same id answers the first update")
    u.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the handler's result")
    u.set_defaults(handler=cmd_update)
    _signal_commands(command)


def _signal_commands(command: Command) -> None:
    """cancel, request-cancel, signal."""
    c = command("cancel", help="cancel a live run (never compensates by itself)")
    c.add_argument("execution_id", metavar="ID")
    c.add_argument("--reason", default="")
    c.set_defaults(handler=cmd_cancel)

    rc = command(
        "request-cancel",
        help="cooperative cancel: the run stays live (CANCELLING) and "
        "its cancel branch may run durable compensations",
    )
    rc.add_argument("execution_id", metavar="ID")
    rc.add_argument("--reason", default="")
    rc.set_defaults(handler=cmd_request_cancel)

    sg = command("signal", help="send a signal to a live run")
    sg.add_argument("execution_id", metavar="ID")
    sg.add_argument("name", metavar="NAME")
    sg.add_argument("payload", nargs="?", default=None, metavar="PAYLOAD_JSON")
    sg.set_defaults(handler=cmd_signal)


def cmd_start(args: argparse.Namespace) -> int:
    data = parse_json(args.input, "INPUT_JSON")
    harvest = harvest_of(args)
    execution_id = harvest.start_workflow(
        args.workflow,
        data,
        execution_id=args.execution_id,
        execution_timeout=args.execution_timeout,
        run_timeout=args.run_timeout,
        priority=args.priority,
    )
    print(execution_id)
    if args.wait is not None:
        return print_result(harvest, execution_id, args.wait)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = store_of(args)
    execution = store.get(args.execution_id)
    execution = dataclasses.replace(execution, children=store.children(args.execution_id))
    for line in render_status(execution):
        print(line)
    place = store.admission(args.execution_id)[0] if execution.waiting else None
    if place is not None:  # from Postgres alone: no worker needs asking
        print(f"  {admission_text(place)}")
    for hint in _waiting(args, store):
        print("  " + waiting_line(hint, args.app))
    attempt_errors = store.attempt_errors(args.execution_id)
    print("  timeline:")
    for line in render_timeline(store.history(args.execution_id), attempt_errors):
        print("  " + line)
    errors = render_errors(attempt_errors)
    if errors:
        print("  errors (every attempt):\n" + "\n".join("  " + line for line in errors))
    return 0


def _waiting(args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    """What the run waits on that no live worker takes (needs --app: its Celery app is asked)."""
    if not args.app:
        return []
    harvest = load_app(args.app)[0]
    if harvest.database_url != store.database_url:
        return []
    return harvest.stuck(args.execution_id) or []


def waiting_line(hint: dict[str, Any], app: str) -> str:
    if hint["kind"] == "slot":  # held back by a limit: no worker is missing
        return f"waiting: {slot_text(hint)} for {hint['waiting_seconds']:.0f}s"
    if hint["kind"] == "admission":  # the run waits for a slot of its workflow's limit
        return f"{hint['text']} for {hint['waiting_seconds']:.0f}s"
    what = f"activity {hint['activity']}" if hint["kind"] == "activity" else "a decision"
    queue = hint["queue"]
    return (
        f"waiting: {what} on queue {queue!r} for {hint['waiting_seconds']:.0f}s — no live worker "
        f"consumes {queue!r} (start one: {PROG} worker -A {app} -Q {queue})"
    )


def cmd_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1")
    rows = store_of(args).list(
        status=args.status,
        workflow_type=args.workflow,
        nd_blocked=True if args.nd_blocked else None,
        limit=args.limit,
    )
    table = [("ID", "WORKFLOW", "STATUS", "CREATED", "CLOSED", "EVENTS", "ND-BLOCKED")]
    for x in rows:
        table.append(
            (
                x.id,
                x.workflow_type,
                x.display_status[:72],
                _stamp(x.created_at),
                _stamp(x.closed_at),
                str(x.history_length),
                f"yes ({x.nd_block_count})" if x.nd_blocked else "",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(no runs)")
    return 0


def _stamp(at: Any) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def cmd_result(args: argparse.Namespace) -> int:
    return print_result(harvest_of(args), args.execution_id, args.timeout)


def print_result(harvest: Harvest, execution_id: str, timeout: float) -> int:
    try:
        value = harvest.result(execution_id, timeout=timeout)
    except TimeoutError as exc:
        raise CliError(str(exc)) from None
    except (WorkflowFailed, WorkflowCancelledError, WorkflowTimedOut) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(value))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    arg = parse_json(args.arg, "ARG_JSON")
    print(json.dumps(harvest_of(args).query(args.execution_id, args.name, arg)))
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    arg = parse_json(args.arg, "ARG_JSON")
    harvest = harvest_of(args)
    print(
        json.dumps(
            harvest.update(args.execution_id, args.name, arg, update_id=args.update_id, timeout=args.timeout)
        )
    )
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    harvest = harvest_of(args)
    status = harvest.cancel_workflow_execution(args.execution_id, reason=args.reason)
    print(f"{args.execution_id} {status}")
    return 0


def cmd_request_cancel(args: argparse.Namespace) -> int:
    harvest = harvest_of(args)
    recorded = harvest.request_cancellation(args.execution_id, reason=args.reason)
    print(
        f"{args.execution_id} {harvest.describe(args.execution_id).display_status}"
        + ("" if recorded else " (a cancellation was already requested)")
    )
    return 0


def cmd_signal(args: argparse.Namespace) -> int:
    payload = parse_json(args.payload, "PAYLOAD_JSON")
    harvest = harvest_of(args)
    harvest.signal(args.execution_id, args.name, payload)
    print(f"signalled {args.execution_id}: {args.name}")
    return 0
