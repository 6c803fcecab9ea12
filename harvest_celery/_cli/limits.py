"""``harvest limits list|set|clear``: the activity limits in force and their run-time overrides
(docs/flow-control.md). Works on ``--app`` or ``--database-url``."""

from __future__ import annotations

import argparse
from typing import Any

from harvest_celery._cli.common import CliError, Command, store_of
from harvest_celery._client_limits import list_limits, set_limit
from harvest_celery._errors import UnknownActivity


def limits_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """limits list, limits set NAME [--concurrency N] [--rate-limit 20/s], limits clear NAME."""
    lim = command("limits", help="list activity limits, or set and clear a run-time override")
    sub = lim.add_subparsers(title="limits commands", metavar="ACTION", required=True)
    ls = sub.add_parser("list", parents=[common], help="every limited activity: use and overrides")
    ls.set_defaults(handler=cmd_limits_list)
    st = sub.add_parser(
        "set", parents=[common], help="override an activity's concurrency (0 holds all) and/or rate limit"
    )
    st.add_argument("name", metavar="ACTIVITY")
    st.add_argument("--concurrency", type=int, metavar="N")
    st.add_argument("--rate-limit", metavar="RATE", help="Celery's format: 20/s, 5/m, 100/h")
    st.set_defaults(handler=cmd_limits_set)
    cl = sub.add_parser("clear", parents=[common], help="drop the override: the declared value again")
    cl.add_argument("name", metavar="ACTIVITY")
    cl.set_defaults(handler=cmd_limits_clear)


def cmd_limits_list(args: argparse.Namespace) -> int:
    rows = list_limits(store_of(args))
    if not rows:
        print("no limited activity")
    for row in rows:
        print(describe(row))
    return 0


def describe(row: dict[str, Any]) -> str:
    """``charge_payment: 3/3 in use, 12 waiting, declared 3 and 20/s, override 1 set …``."""
    concurrency = _in_force(row, "concurrency")
    rate = _in_force(row, "rate_limit")
    shown = f"{row['in_use']}/{concurrency} in use" if concurrency is not None else f"{row['in_use']} in use"
    if rate is not None:
        shown += f" at {rate}"
    declared = " and ".join(
        str(v) for v in (row["declared_concurrency"], row.get("declared_rate_limit")) if v is not None
    )
    overrides = " and ".join(
        str(v) for v in (row["override_concurrency"], row.get("override_rate_limit")) if v is not None
    )
    extra = f", override {overrides} set {row['override_set_at']:%Y-%m-%d %H:%M:%S}" if overrides else ""
    return f"{row['name']}: {shown}, {row['waiting']} waiting, declared {declared or 'none'}{extra}"


def _in_force(row: dict[str, Any], what: str) -> Any:
    override = row.get(f"override_{what}")
    return override if override is not None else row.get(f"declared_{what}")


def _set(args: argparse.Namespace, concurrency: int | None, clear: bool, rate: str | None = None) -> int:
    try:
        set_limit(store_of(args), args.name, concurrency, rate_limit=rate, clear=clear)
    except UnknownActivity:
        raise CliError(f"no limited activity named {args.name!r}") from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return cmd_limits_list(args)


def cmd_limits_set(args: argparse.Namespace) -> int:
    return _set(args, args.concurrency, clear=False, rate=args.rate_limit)


def cmd_limits_clear(args: argparse.Namespace) -> int:
    return _set(args, None, clear=True)
