"""The serving commands: ``db upgrade``, ``worker`` (execs ``celery worker`` on the app's Celery
app with harvest's queues) and ``api`` (the operator HTTP API; FastAPI is imported only here, and
only when it runs: it is the optional ``[api]`` extra)."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence

from harvest_celery._cli.common import PROG, CliError, Command, database_url, harvest_of, load_app, safe_url
from harvest_celery._client import Harvest
from harvest_celery._store.migrate import upgrade

# ``celery -A`` of an app that does not expose its Celery app as a module-level name: the package
# resolves it lazily from HARVEST_APP (``harvest_celery._cli.__getattr__``).
CELERY_APP_TARGET = "harvest_celery._cli:celery_app"

Exec = Callable[[list[str], dict[str, str]], None]


def worker_commands(command: Command, common: argparse.ArgumentParser, *, execute: Exec) -> None:
    """db upgrade, worker, api. ``execute(argv, env)`` replaces the process with the worker."""
    db = command("db", help="database schema")
    db.set_defaults(help_parser=db)
    db_sub = db.add_subparsers(title="db commands", metavar="DB_COMMAND")
    up = db_sub.add_parser("upgrade", parents=[common], help="apply the schema migrations (alembic upgrade)")
    up.add_argument("--revision", default="head")
    up.set_defaults(handler=cmd_db_upgrade)

    w = command("worker", help="run a Celery worker for the --app (decisions and activities)")
    w.usage = (
        f"{PROG} worker [-A APP] [-Q QUEUES] [--metrics-port PORT] [--metrics-addr ADDR]"
        " [CELERY WORKER OPTION ...]"
    )
    w.epilog = (
        "Every other option goes to 'celery worker' unchanged (-n, -E, -c, -P, -l, -O fair, "
        "--without-gossip, ...; see 'celery worker --help'). Without -n the node name is "
        "harvest-decide@%h for a worker of the decision queue alone, else "
        "harvest-<queues joined by '-'>@%h; without -l/--loglevel the level is INFO."
    )
    # An abbreviation must not take a Celery option for one of harvest's (--q, --metrics, ...).
    w.allow_abbrev = False
    w.add_argument(
        "-Q",
        "--queues",
        default=None,
        help="comma-separated queues (default: 'default' and the decision queue 'harvest')",
    )
    w.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics (aggregated over the pool processes) on this port",
    )
    w.add_argument(
        "--metrics-addr",
        default=None,
        help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 in a container)",
    )
    w.set_defaults(handler=cmd_worker, celery_args=[], execute=execute)
    _api_command(command)


def _api_command(command: Command) -> None:
    a = command("api", help="serve the operator HTTP API for the --app (needs the [api] extra)")
    a.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    a.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    a.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without HARVEST_API_TOKEN: anyone may read and change runs, so it binds to loopback only",
    )
    a.set_defaults(handler=cmd_api)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    url = database_url(args)
    upgrade(url, args.revision)
    print(f"database {safe_url(url)} upgraded to {args.revision}")
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    """Every endpoint but /healthz needs ``$HARVEST_API_TOKEN``; without it the API refuses to
    start, unless ``--insecure-no-auth``, which binds to loopback only (``serving_token``)."""
    harvest = harvest_of(args)
    try:
        import uvicorn

        from harvest_celery._web.api import create_app, serving_token
    except ImportError as exc:
        raise CliError(
            f"'{PROG} api' needs the api extra (pip install 'harvest-celery[api]'): {exc}"
        ) from None
    try:
        token = serving_token(os.environ.get("HARVEST_API_TOKEN"), args.host, insecure=args.insecure_no_auth)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    uvicorn.run(create_app(harvest, token=token), host=args.host, port=args.port)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    if not args.app:
        raise CliError(f"'{PROG} worker' needs -A/--app module[:attr] (or HARVEST_APP)")
    harvest, module_name, attr = load_app(args.app)
    if harvest.celery_app is None:
        raise CliError(
            f"--app {args.app!r} is in embedded mode (no celery_app): its worker runs "
            "in-process; give the Harvest a Celery app to run 'harvest worker'"
        )
    decision_queue = harvest.runtime.settings.decision_queue
    queues = worker_queues(args.queues, decision_queue)
    argv = worker_argv(celery_target(harvest, module_name), queues, decision_queue, args.celery_args)
    env = worker_env(dict(os.environ), f"{module_name}:{attr}", args)
    sys.stdout.flush()
    sys.stderr.flush()
    args.execute(argv, env)
    return 0  # not reached


def celery_target(harvest: Harvest, module_name: str) -> str:
    """What ``celery -A`` should import: ``module:attr`` of the Harvest's Celery app. Celery
    cannot follow a dotted attribute, so the app must be a module-level name of the --app module;
    failing that, the CLI package's ``celery_app`` (resolved lazily from ``HARVEST_APP``)."""
    module = sys.modules[module_name]
    for name, value in vars(module).items():
        if value is harvest.celery_app and not name.startswith("__"):
            return f"{module_name}:{name}"
    return CELERY_APP_TARGET


def worker_argv(
    target: str, queues: list[str], decision_queue: str, celery_args: Sequence[str] = ()
) -> list[str]:
    """The command line of ``celery -A target worker``: harvest's queues, then every option
    ``harvest worker`` does not own, unchanged. Without ``-n``/``--hostname`` the node is named
    after its role (:func:`default_node_name`), so two harvest workers on one host stay apart in
    Flower and ``celery inspect``; without ``-l``/``--loglevel`` the level is ``INFO``."""
    argv = [sys.executable, "-m", "celery", "-A", target, "worker", "-Q", ",".join(queues)]
    if not _gives_option(celery_args, "-n", "--hostname"):
        argv += ["-n", default_node_name(queues, decision_queue)]
    if not _gives_option(celery_args, "-l", "--loglevel"):
        argv += ["--loglevel", "INFO"]
    return argv + list(celery_args)


def worker_queues(queues: str | None, decision_queue: str) -> list[str]:
    """``-Q`` as a list (order kept, duplicates dropped); by default ``default`` and the decision
    queue."""
    names = [q.strip() for q in (queues or "").split(",") if q.strip()]
    return list(dict.fromkeys(names)) or ["default", decision_queue]


_NODE_NAME_MAX = 48  # the part before '@': readable in Flower, well under a DNS label's 63


def default_node_name(queues: Sequence[str], decision_queue: str) -> str:
    """``harvest-decide@%h`` for a worker of the decision queue alone, else
    ``harvest-<queues joined by '-'>@%h``. Characters a node name should not hold become ``_``;
    a name longer than 48 characters keeps its head and gains a digest of the whole, so two long
    queue lists still name two nodes."""
    if list(queues) == [decision_queue]:
        name = "harvest-decide"
    else:
        name = "harvest-" + "-".join(re.sub(r"[^A-Za-z0-9_.-]", "_", q) for q in queues)
    if len(name) > _NODE_NAME_MAX:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[: _NODE_NAME_MAX - 9].rstrip('-_.')}-{digest}"
    return f"{name}@%h"


def _gives_option(args: Sequence[str], short: str, long: str) -> bool:
    """Whether a Celery command line sets an option: ``-n X``, ``-nX``, ``--hostname X`` or
    ``--hostname=X`` (nothing after ``--`` counts)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == long or arg.startswith(long + "=") or arg.startswith(short):
            return True
    return False


def worker_env(env: dict[str, str], app: str, args: argparse.Namespace) -> dict[str, str]:
    """The worker's environment. ``--metrics-port`` sets ``HARVEST_METRICS_PORT``, so the worker's
    main process serves ``/metrics`` once ready, aggregated over its pool children through a fresh
    ``PROMETHEUS_MULTIPROC_DIR`` (unless one is already set)."""
    env["HARVEST_APP"] = app
    if args.metrics_port is not None:
        env["HARVEST_METRICS_PORT"] = str(args.metrics_port)
        if args.metrics_addr:
            env["HARVEST_METRICS_ADDR"] = args.metrics_addr
        if not env.get("PROMETHEUS_MULTIPROC_DIR"):
            env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="harvest-metrics-")
    return env
