"""``harvest replay`` and ``harvest export``: the CLI glue of the pre-deploy replay check
(``_replayer``).

Exit codes: ``replay`` 0 when every run replays (or in ``--canary`` mode), 1 when a run diverged
or could not be replayed in ``--strict`` mode (the default); 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

from harvest_celery._cli.common import Command, harvest_of, store_of
from harvest_celery._client import Harvest
from harvest_celery._replayer import WorkflowReplayer, export_run, write_export
from harvest_celery._store.store import Store


def replay_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """replay, export."""
    r = command("replay", help="replay stored histories against the current code (pre-deploy check)")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument(
        "--strict",
        dest="strict",
        action="store_true",
        default=True,
        help="exit 1 if any run diverged or could not be replayed (the default)",
    )
    mode.add_argument(
        "--canary", dest="strict", action="store_false", help="report only: exit 0 whatever the verdicts"
    )
    r.add_argument("--workflow", default=None, help="only runs of this workflow type")
    r.add_argument("--status", default=None, type=str.upper, help="only runs with this status")
    r.add_argument(
        "--id", dest="ids", action="append", default=[], metavar="ID", help="this run (repeatable)"
    )
    r.add_argument(
        "--limit",
        type=int,
        default=100,
        metavar="N",
        help="the newest N matching runs (default 100; ignored with --id)",
    )
    r.add_argument(
        "--file",
        dest="files",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="replay the runs of these export files instead of the database",
    )
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(handler=cmd_replay)

    x = command("export", help="write a run's history as JSON, payloads decoded (for harvest replay --file)")
    x.add_argument("execution_id", metavar="ID")
    x.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="write to FILE (created readable by its owner only) instead of stdout",
    )
    x.set_defaults(handler=cmd_export)


def cmd_replay(args: argparse.Namespace) -> int:
    if args.files and (args.ids or args.workflow or args.status):
        raise ValueError(
            "--file replays the files' runs: it does not combine with --id, --workflow or --status"
        )
    if args.limit < 1:
        raise ValueError("--limit must be at least 1")
    harvest = harvest_of(args)
    replayer = WorkflowReplayer(harvest, store=None if args.files else _store_of(args, harvest))
    if args.files:
        report = replayer.replay_files(args.files)
    else:
        report = replayer.replay_database(
            workflow=args.workflow, status=args.status, ids=args.ids, limit=args.limit
        )
    if args.json:
        print(json.dumps({**report.to_dict(), "strict": args.strict}, indent=1))
    else:
        for line in report.lines():
            print(line)
        if not report.passed:
            print("strict: failing" if args.strict else "canary: reported only, not failing")
    return report.exit_code(strict=args.strict)


def _store_of(args: argparse.Namespace, harvest: Harvest) -> Store:
    """The app's store (its codec and payload store decode the payloads), on ``--database-url``
    when one is given (e.g. a read replica)."""
    url = getattr(args, "database_url", None)
    if not url or url == harvest.database_url:
        return harvest.store
    return Store(url, payloads=harvest.store.payloads)


def cmd_export(args: argparse.Namespace) -> int:
    # with --app, its codec and payload store decode the payloads, on --database-url too
    store = _store_of(args, harvest_of(args)) if args.app else store_of(args)
    document = export_run(store, args.execution_id)
    if args.out is None:
        json.dump(document, sys.stdout, indent=1, ensure_ascii=False)
        print()
        return 0
    write_export(document, args.out)
    print(
        f"exported {args.execution_id} ({len(document['events'])} events) to {args.out}; "
        "it holds the run's payloads decoded",
        file=sys.stderr,
    )
    return 0
