"""What every ``harvest`` command shares: the usage error, JSON arguments, and resolving ``--app``
and ``--database-url`` into a ``Harvest`` or a ``Store``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Protocol

from harvest_celery._client import Harvest
from harvest_celery._store.store import Store

PROG = "harvest"


class CliError(Exception):
    """A usage error: printed as ``harvest: error: ...``, exit status 2."""


class Command(Protocol):
    """Adds one subcommand (with the shared -A/--database-url options) and returns its parser."""

    def __call__(self, name: str, help: str) -> argparse.ArgumentParser: ...


def parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON ({exc}): {text!r}") from None


def load_app(spec: str) -> tuple[Harvest, str, str]:
    """Import ``module[:attr]``; returns (instance, module, attr). Without ``attr`` the module's
    ``harvest`` is used, or else its only ``Harvest`` instance."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise CliError(f"--app {spec!r}: expected module:attr")
    if os.getcwd() not in sys.path:  # like celery -A: the current directory is importable
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from None
    if not attr:
        found = [k for k, v in vars(module).items() if isinstance(v, Harvest)]
        if "harvest" in found or len(found) != 1:
            attr = "harvest"
        else:
            attr = found[0]
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"--app {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, Harvest):
        obj = obj()
    if not isinstance(obj, Harvest):
        raise CliError(f"--app {spec!r} is a {type(obj).__name__}, not a Harvest instance")
    return obj, module_name, attr


def harvest_of(args: argparse.Namespace) -> Harvest:
    """The ``Harvest`` of ``--app``, for the commands that run or change workflows."""
    if not args.app:
        raise CliError(
            f"'{PROG} {args.handler.__name__[4:]}' needs --app module:attr (or HARVEST_APP) naming "
            "the Harvest instance whose workflows it runs"
        )
    return load_app(args.app)[0]


def database_url(args: argparse.Namespace) -> str:
    if args.database_url:
        return str(args.database_url)
    if args.app:
        return load_app(args.app)[0].database_url
    raise CliError("no database: pass --database-url (or set HARVEST_DATABASE_URL), or --app")


def store_of(args: argparse.Namespace) -> Store:
    """The app's store (its codec and payload store), or a plain one on ``--database-url``."""
    if args.app and not args.database_url:
        return load_app(args.app)[0].store
    return Store(database_url(args))


def safe_url(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only used for display
        return url
