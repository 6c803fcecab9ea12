"""The ``harvest`` command line.

::

    harvest [--app module:attr] [--database-url URL] COMMAND ...

``--app`` (or ``HARVEST_APP``) names a ``Harvest`` instance to import, like ``celery -A``; commands
that run or change workflows need it (start, signal, cancel, request-cancel, result, query, worker,
api, and the operator actions terminate, pause, resume, reset, retry, erase, purge — erasure and
retention delete offloaded blobs through the app's payload store — and replay, which replays
histories against the app's workflows). Commands that only read or migrate the database (db
upgrade, show, list, export) also accept ``--database-url`` (or ``HARVEST_DATABASE_URL``) instead.
``harvest demo`` needs neither.

One module per command group: ``runs`` (start, show, list, result, query, signal, cancel,
request-cancel), ``operator`` (terminate, pause, resume, reset, retry, erase, purge), ``worker``
(db upgrade, worker, api), ``replay`` (replay, export) and ``demo``; ``common`` resolves the app
and the database for all of them.

Exit codes: 0 success; 1 the run asked about failed or was cancelled (``result``, ``start
--wait``); 2 a usage error or a ``HarvestError`` (``harvest: error: ...`` on stderr); 130 on
Ctrl-C; 141 when the reader of the output went away (``harvest list | head``): quietly, like a
Unix tool killed by SIGPIPE.

May not import: ``contrib`` (the frameworks' commands call :func:`main`); ``_web`` only inside
``harvest api`` (FastAPI is the optional ``[api]`` extra).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from functools import partial
from typing import Any

from harvest_celery._cli.common import PROG, CliError, load_app
from harvest_celery._cli.demo import demo_command
from harvest_celery._cli.limits import limits_commands
from harvest_celery._cli.operator import operator_commands
from harvest_celery._cli.replay import replay_commands
from harvest_celery._cli.runs import run_commands, waiting_line
from harvest_celery._cli.schedules import schedule_commands
from harvest_celery._cli.worker import default_node_name, worker_argv, worker_commands, worker_queues
from harvest_celery._errors import HarvestError

__all__ = ["default_node_name", "main", "waiting_line", "worker_argv", "worker_queues"]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        # Known args only: 'harvest worker' hands every option it does not own to 'celery worker';
        # any other command refuses them, as parse_args would.
        args, extras = parser.parse_known_args(argv)
        if extras and not hasattr(args, "celery_args"):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        if extras:
            args.celery_args = extras
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0) if isinstance(exc.code, int) or exc.code is None else 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "handler", None) is None:  # no (sub)command: help for the level reached
        getattr(args, "help_parser", parser).print_help(sys.stderr)
        return 2
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except (CliError, HarvestError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _reader_gone() -> int:
    """The output's reader closed it (``harvest list | head``): no traceback, and stdout pointed
    at /dev/null so the interpreter's last flush of what is buffered fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Durable workflows on Celery + Postgres.")
    app_help = "module[:attr] of a Harvest instance, like celery -A (env HARVEST_APP)"
    url_help = "database for commands that only need the database (env HARVEST_DATABASE_URL)"
    p.add_argument("-A", "--app", default=os.environ.get("HARVEST_APP"), metavar="APP", help=app_help)
    p.add_argument(
        "--database-url", default=os.environ.get("HARVEST_DATABASE_URL"), metavar="URL", help=url_help
    )
    # The same options after the command name (harvest worker -A myshop.celery), listed in each
    # command's --help; SUPPRESS keeps a value given before the command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-A", "--app", default=argparse.SUPPRESS, metavar="APP", help=app_help)
    common.add_argument("--database-url", default=argparse.SUPPRESS, metavar="URL", help=url_help)
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help)

    for add in (
        partial(worker_commands, execute=_execute),
        run_commands,
        operator_commands,
        limits_commands,
        replay_commands,
        schedule_commands,
        demo_command,
    ):
        add(command, common)
    return p


def _execute(argv: list[str], env: dict[str, str]) -> None:
    _exec(argv, env)  # looked up at call time: tests replace ``_cli._exec``


def _exec(argv: list[str], env: dict[str, str]) -> None:
    os.execve(argv[0], argv, env)


def __getattr__(name: str) -> Any:
    # ``celery -A harvest_celery._cli:celery_app``: the Celery app of the Harvest named by
    # HARVEST_APP, for apps that do not expose it as a module-level name.
    if name == "celery_app":
        spec = os.environ.get("HARVEST_APP")
        if not spec:
            raise AttributeError("celery_app: HARVEST_APP is not set")
        return load_app(spec)[0].celery_app
    raise AttributeError(name)
