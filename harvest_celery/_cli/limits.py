"""``harvest limits list|set|clear``: the activity limits in force and their run-time overrides
(docs/flow-control.md). Works on ``--app`` or ``--database-url``."""

from __future__ import annotations

import argparse

from harvest_celery._cli.common import CliError, Command, store_of
from harvest_celery._client_limits import list_limits, set_limit
from harvest_celery._errors import UnknownActivity


def limits_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """limits list, limits set NAME --concurrency N, limits clear NAME."""
    lim = command("limits", help="list activity limits, or set and clear a run-time override")
    sub = lim.add_subparsers(title="limits commands", metavar="ACTION", required=True)
    ls = sub.add_parser("list", parents=[common], help="every limited activity: use and overrides")
    ls.set_defaults(handler=cmd_limits_list)
    st = sub.add_parser("set", parents=[common], help="override an activity's concurrency (0 holds all)")
    st.add_argument("name", metavar="ACTIVITY")
    st.add_argument("--concurrency", type=int, required=True, metavar="N")
    st.set_defaults(handler=cmd_limits_set)
    cl = sub.add_parser("clear", parents=[common], help="drop the override: the declared value again")
    cl.add_argument("name", metavar="ACTIVITY")
    cl.set_defaults(handler=cmd_limits_clear)


def cmd_limits_list(args: argparse.Namespace) -> int:
    rows = list_limits(store_of(args))
    if not rows:
        print("no limited activity")
    for row in rows:
        override = row["override_concurrency"]
        in_force = override if override is not None else row["declared_concurrency"]
        shown = f"{row['in_use']}/{in_force} in use" if in_force is not None else f"{row['in_use']} in use"
        extra = (
            f", override {override} set {row['override_set_at']:%Y-%m-%d %H:%M:%S}"
            if override is not None
            else ""
        )
        print(
            f"{row['name']}: {shown}, {row['waiting']} waiting, declared {row['declared_concurrency']}{extra}"
        )
    return 0


def _set(args: argparse.Namespace, concurrency: int | None, clear: bool) -> int:
    try:
        set_limit(store_of(args), args.name, concurrency, clear=clear)
    except UnknownActivity:
        raise CliError(f"no limited activity named {args.name!r}") from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return cmd_limits_list(args)


def cmd_limits_set(args: argparse.Namespace) -> int:
    return _set(args, args.concurrency, clear=False)


def cmd_limits_clear(args: argparse.Namespace) -> int:
    return _set(args, None, clear=True)
