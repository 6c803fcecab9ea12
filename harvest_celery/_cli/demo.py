"""``harvest demo``: the example workflows in embedded mode (``_demo``); needs no ``--app`` and no
database."""

from __future__ import annotations

import argparse
import sys

from harvest_celery._cli.common import Command
from harvest_celery._demo import run_demo


def demo_command(command: Command, common: argparse.ArgumentParser) -> None:
    d = command("demo", help="run the example workflows in embedded mode (no Postgres, no Redis)")
    d.add_argument("--keep", action="store_true", help="keep the demo's SQLite database and print its path")
    d.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(sys.stdout, keep=args.keep)
