"""``harvest scheduler`` (the firing loop) and ``harvest schedules
list|create|pause|resume|trigger|backfill|delete|import-beat`` (docs/schedules.md). All need
``-A``: a schedule fires only where its workflow is registered (or its task adopted), and its
input goes through the app's codec and payload store."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import signal
import sys
import threading
from datetime import datetime, timedelta
from typing import Any

from harvest_celery._cli.common import CliError, Command, harvest_of, parse_json
from harvest_celery._runtime import metrics, scheduler


def schedule_commands(command: Command, common: argparse.ArgumentParser) -> None:
    s = command("scheduler", help="fire due schedule ticks (any number may run; each tick makes one run)")
    s.add_argument(
        "--metrics-port", type=int, default=None, metavar="PORT", help="serve /metrics on this port"
    )
    s.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR", help="address for --metrics-port")
    s.set_defaults(handler=cmd_scheduler)

    group = command(
        "schedules",
        help="durable schedules: list, create, pause, resume, trigger, backfill, delete, import-beat",
    )
    group.set_defaults(handler=None, help_parser=group)
    sub = group.add_subparsers(title="schedule commands", metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help)

    _actions(action)


def _actions(action: Command) -> None:
    ls = action("list", help="every schedule, its next fire time and its last run")
    ls.add_argument("--failing", action="store_true", help="only schedules whose last tick's run failed")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=cmd_schedules_list)

    cr = action("create", help="create a schedule (exactly one of --cron, --every)")
    cr.add_argument("name")
    cr.add_argument("--workflow", required=True)
    cr.add_argument("--cron", default=None)
    cr.add_argument("--every", type=float, default=None, metavar="SECONDS")
    cr.add_argument("--timezone", default=None)
    cr.add_argument("--input", default=None, metavar="JSON")
    cr.add_argument("--overlap", default="skip", choices=("skip", "buffer_one", "allow_all"))
    cr.add_argument("--catchup-window", type=float, default=0.0, metavar="SECONDS")
    cr.add_argument("--jitter", type=float, default=None, metavar="SECONDS")
    cr.add_argument("--max-runs", type=int, default=None)
    cr.add_argument("--end-at", default=None, metavar="ISO8601")
    cr.set_defaults(handler=cmd_schedules_create)

    pa = action("pause", help="stop firing (ticks while paused count skipped)")
    pa.add_argument("name")
    pa.add_argument("--note", default="")
    pa.set_defaults(handler=cmd_schedules_pause)

    rs = action("resume", help="fire again (the paused ticks are not caught up)")
    rs.add_argument("name")
    rs.set_defaults(handler=cmd_schedules_resume)

    tr = action("trigger", help="start a run now (<name>@manual-<8 hex>)")
    tr.add_argument("name")
    tr.add_argument("--overlap", default=None, choices=("skip", "buffer_one", "allow_all"))
    tr.set_defaults(handler=cmd_schedules_trigger)

    bf = action(
        "backfill", help="start the nominal ticks of a past range (ending at or before the last tick)"
    )
    bf.add_argument("name")
    bf.add_argument("--start", required=True, metavar="ISO8601")
    bf.add_argument("--end", required=True, metavar="ISO8601")
    bf.set_defaults(handler=cmd_schedules_backfill)

    de = action("delete", help="delete a schedule and its stored input (runs keep their own copies)")
    de.add_argument("name")
    de.set_defaults(handler=cmd_schedules_delete)

    ib = action(
        "import-beat",
        help="turn a Celery app's beat_schedule into schedules that start its adopted tasks",
    )
    ib.add_argument(
        "celery_app", metavar="MODULE:APP", help="the Celery app (module:attr; attr app or celery)"
    )
    ib.add_argument("--update", action="store_true", help="apply changed entries to their schedules")
    ib.add_argument(
        "--skip-unsupported", action="store_true", help="skip the entries harvest cannot honour (listed)"
    )
    ib.add_argument("--overlap", default="skip", choices=("skip", "buffer_one", "allow_all"))
    ib.add_argument("--json", action="store_true")
    ib.set_defaults(handler=cmd_schedules_import_beat)


def _instant(text: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"{what} {text!r} is not an ISO 8601 time") from None
    if value.tzinfo is None:
        raise CliError(f"{what} {text!r} needs a UTC offset (Z or +01:00)")
    return value


def cmd_scheduler(args: argparse.Namespace) -> int:
    harvest = harvest_of(args)
    stop = threading.Event()
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port, args.metrics_addr)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"harvest scheduler: firing the schedules of queue {harvest.runtime.settings.decision_queue!r}",
        flush=True,
    )
    scheduler.run_forever(harvest.runtime, stop, lambda run_id: print(f"fired {run_id}", flush=True))
    return 0


def cmd_schedules_list(args: argparse.Namespace) -> int:
    found = [s for s in harvest_of(args).list_schedules() if s["failing"] or not args.failing]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for s in found:
        when = s["cron"] and f"cron {s['cron']!r} {s['timezone']}" or f"every {s['every_seconds']}s"
        state = "paused" if s["paused"] else "ended" if s["ended"] else f"next {s['next_fire_at']}"
        last = f"{s['last_run_id']} {s['last_run_status']}" if s["last_run_id"] else "-"
        print(
            f"{s['name']}  {'task ' if s['target'] == 'task' else ''}{s['workflow']}  {when}  {state}  last {last}  "
            f"fired {s['fired']} skipped {s['skipped']} missed {s['missed']}"
        )
    return 0


def cmd_schedules_create(args: argparse.Namespace) -> int:
    harvest_of(args).create_schedule(
        args.name,
        workflow=args.workflow,
        cron=args.cron,
        every=timedelta(seconds=args.every) if args.every is not None else None,
        timezone=args.timezone,
        input=parse_json(args.input, "--input"),
        overlap=args.overlap,
        catchup_window=timedelta(seconds=args.catchup_window),
        jitter=timedelta(seconds=args.jitter) if args.jitter is not None else None,
        max_runs=args.max_runs,
        end_at=_instant(args.end_at, "--end-at") if args.end_at else None,
    )
    print(f"created {args.name}")
    return 0


def cmd_schedules_pause(args: argparse.Namespace) -> int:
    harvest_of(args).pause_schedule(args.name, args.note)
    print(f"paused {args.name}")
    return 0


def cmd_schedules_resume(args: argparse.Namespace) -> int:
    skipped = harvest_of(args).resume_schedule(args.name)
    print(f"resumed {args.name} ({skipped} tick(s) while paused counted skipped)")
    return 0


def cmd_schedules_trigger(args: argparse.Namespace) -> int:
    run_id = harvest_of(args).trigger_schedule(args.name, overlap=args.overlap)
    print(run_id if run_id is not None else f"skipped: {args.name}'s previous run is open")
    return 0 if run_id is not None else 1


def cmd_schedules_backfill(args: argparse.Namespace) -> int:
    out = harvest_of(args).backfill_schedule(
        args.name, _instant(args.start, "--start"), _instant(args.end, "--end")
    )
    for run_id in out["started"]:
        print(f"started {run_id}")
    for run_id in out["already_ran"]:
        print(f"already ran {run_id}")
    return 0


def cmd_schedules_delete(args: argparse.Namespace) -> int:
    harvest_of(args).delete_schedule(args.name)
    print(f"deleted {args.name}")
    return 0


def _celery_app(spec: str) -> Any:
    """Import ``module[:attr]`` (without ``attr``: the module's ``app``, else ``celery``, as
    ``celery -A`` looks)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise CliError(f"import-beat {spec!r}: expected module:app")
    if os.getcwd() not in sys.path:  # like celery -A: the current directory is importable
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"import-beat {spec!r}: cannot import {module_name!r}: {exc}") from None
    for name in [attr] if attr else ["app", "celery"]:
        obj: Any = module
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return obj
    raise CliError(f"import-beat {spec!r}: {module_name!r} has no attribute {attr or 'app'!r}")


def cmd_schedules_import_beat(args: argparse.Namespace) -> int:
    harvest = harvest_of(args)
    done = harvest.import_beat(
        _celery_app(args.celery_app),
        update=args.update,
        skip_unsupported=args.skip_unsupported,
        overlap=args.overlap,
    )
    if args.json:
        print(json.dumps(dataclasses.asdict(done), indent=2))
        return 0
    for verb, names in (("created", done.created), ("unchanged", done.unchanged), ("updated", done.updated)):
        for name in names:
            print(f"{verb} {name}")
    for name, why in done.refused.items():
        print(f"skipped {name}: {why}")
    return 0
