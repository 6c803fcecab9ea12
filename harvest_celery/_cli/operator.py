"""The operator actions: terminate, pause, resume, reset, retry, erase, purge (each needs
``--app``: erasure and retention delete offloaded blobs through the app's payload store)."""

from __future__ import annotations

import argparse

from harvest_celery._cli.common import CliError, Command, harvest_of


def operator_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """terminate, pause, resume, reset, retry, erase, purge."""
    t = command("terminate", help="seal a live run at once, without running workflow code")
    t.add_argument("execution_id", metavar="ID")
    t.add_argument("--reason", default="")
    t.set_defaults(handler=cmd_terminate)

    pa = command("pause", help="hold a live run's decisions until resumed")
    pa.add_argument("execution_id", metavar="ID")
    pa.set_defaults(handler=cmd_pause)

    rsm = command("resume", help="release a paused run")
    rsm.add_argument("execution_id", metavar="ID")
    rsm.set_defaults(handler=cmd_resume)

    rs = command("reset", help="fork a new run from the first N events of a run; prints its id")
    rs.add_argument("execution_id", metavar="ID")
    rs.add_argument(
        "--to-seq", type=int, required=True, metavar="N", help="how many leading events of the run to keep"
    )
    rs.add_argument("--new-id", default=None, help="the new run's id (default: a fresh one)")
    rs.set_defaults(handler=cmd_reset)

    rt = command("retry", help="retry a failed DAG run from a node; prints the plan and the new run's id")
    rt.add_argument("dag", metavar="DAG")
    rt.add_argument("execution_id", metavar="ID")
    rt.add_argument(
        "--from-node",
        default=None,
        metavar="NODE",
        help="the node to re-run from (default: the first failed node)",
    )
    rt.add_argument("--new-id", default=None, help="the new run's id (default: a fresh one)")
    rt.add_argument("--dry-run", action="store_true", help="print the plan without starting a run")
    rt.set_defaults(handler=cmd_retry)
    _retention_commands(command)


def _retention_commands(command: Command) -> None:
    """erase, purge."""
    er = command("erase", help="erase the payloads of a terminal run (PII erasure; irreversible)")
    er.add_argument("execution_id", metavar="ID")
    er.add_argument("--with-forks", action="store_true", help="also erase its fork family")
    er.set_defaults(handler=cmd_erase)

    pg = command("purge", help="delete terminal runs closed more than DAYS days ago")
    pg.add_argument("--older-than", type=float, required=True, metavar="DAYS")
    pg.add_argument("--batch", type=int, default=500, metavar="N", help="runs deleted per transaction")
    pg.set_defaults(handler=cmd_purge)


def cmd_terminate(args: argparse.Namespace) -> int:
    harvest = harvest_of(args)
    harvest.terminate(args.execution_id, reason=args.reason)
    print(f"{args.execution_id} {harvest.describe(args.execution_id).status}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    harvest_of(args).pause(args.execution_id)
    print(f"paused {args.execution_id}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    harvest_of(args).resume(args.execution_id)
    print(f"resumed {args.execution_id}")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    if args.to_seq < 1:
        raise CliError("--to-seq must be at least 1")
    new_id = harvest_of(args).reset(args.execution_id, args.to_seq, new_execution_id=args.new_id)
    print(new_id)
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    answer = harvest_of(args).retry_dag_run(
        args.dag, args.execution_id, args.from_node, dry_run=args.dry_run, new_execution_id=args.new_id
    )
    print(f"retry of {answer['source_run_id']} from node {answer['retry_from']}")
    print(f"  carried: {', '.join(answer['carried']) or '(none)'}")
    print(f"  rerun:   {', '.join(answer['rerun']) or '(none)'}")
    print("dry run: no run started" if answer["run_id"] is None else answer["run_id"])
    return 0


def cmd_erase(args: argparse.Namespace) -> int:
    counts = harvest_of(args).erase_payloads(args.execution_id, with_forks=args.with_forks)
    print(
        f"erased {args.execution_id}: {counts['fields']} payload fields in {counts['events']} "
        f"events, {counts['blobs']} blobs deleted"
    )
    if counts["forks"]:
        print(f"  with its fork family: {', '.join(counts['forks'])}")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    if not 0 <= args.older_than <= 36500:  # also refuses nan
        raise CliError("--older-than must be a number of days between 0 and 36500")
    if args.batch < 1:
        raise CliError("--batch must be at least 1")
    counts = harvest_of(args).purge(args.older_than, args.batch)
    print(
        f"purged {counts['runs']} runs closed more than {args.older_than:g} days ago: "
        f"{counts['events']} events, {counts['blobs']} blobs"
    )
    return 0
