"""``manage.py harvest …``: the ``harvest`` command line on this project's ``Harvest`` —
``manage.py harvest db upgrade``, ``manage.py harvest worker -Q harvest,default``,
``manage.py harvest show ID``, ``list``, ``cancel``, ``result``, ``replay``… (``manage.py harvest
--help`` lists them). Every argument after ``harvest`` goes to ``harvest_celery._cli.main``
unchanged, with ``--app`` naming the project's ``Harvest`` (``get_harvest``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from harvest_celery._cli import main

APP = "harvest_celery.contrib.django:get_harvest"


def run(argv: list[str]) -> int:
    return main(["--app", APP, *argv])


class Command(BaseCommand):
    help = "The harvest command line on this project's Harvest (manage.py harvest --help)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def run_from_argv(self, argv: list[str]) -> None:
        # argv: [prog, "harvest", ...]; Django's global --settings/--pythonpath were applied by
        # manage.py already, everything else belongs to the harvest command line
        code = run(_without_django_options(argv[2:]))
        if code:
            sys.exit(code)

    def handle(self, *args: str, **options: Any) -> None:
        code = run(list(args))
        if code:
            raise CommandError(f"harvest {' '.join(args)} exited with status {code}", returncode=code)


def _without_django_options(argv: list[str]) -> list[str]:
    """Drop Django's global ``--settings``/``--pythonpath`` (manage.py applied them)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--settings", "--pythonpath"):
            skip = True
        elif not arg.startswith(("--settings=", "--pythonpath=")):
            out.append(arg)
    return out
