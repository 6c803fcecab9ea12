"""The ``harvest`` command line.

::

    harvest [--app module:attr] [--database-url URL] COMMAND ...

``--app`` (or ``HARVEST_APP``) names a ``Harvest`` instance to import, like ``celery -A``; commands
that run or change workflows need it (start, signal, cancel, request-cancel, result, worker, api,
and the operator actions terminate, pause, resume, reset, retry, erase, purge — erasure and retention delete
offloaded blobs through the app's payload store — and replay, which replays histories against the
app's workflows: see ``_cli_replay``). Commands that only
read or migrate the database (db upgrade, show, list, export) also accept ``--database-url`` (or
``HARVEST_DATABASE_URL``) instead. ``harvest demo`` needs neither.

Exit codes: 0 success; 1 the run asked about failed or was cancelled (``result``, ``start
--wait``); 2 a usage error or a ``HarvestError`` (``harvest: error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol

from harvest_celery._cli_replay import replay_commands
from harvest_celery._client import Harvest
from harvest_celery._core.timeline import render_errors, render_status, render_timeline
from harvest_celery._demo import run_demo
from harvest_celery._errors import HarvestError, WorkflowCancelledError, WorkflowFailed
from harvest_celery._store.migrate import upgrade
from harvest_celery._store.store import Store

PROG = "harvest"


class CliError(Exception):
    """A usage error: printed as ``harvest: error: ...``, exit status 2."""


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
        return int(args.handler(args) or 0)
    except (CliError, HarvestError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# ── argument parsing ─────────────────────────────────────────────────────────────────────────
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Durable workflows on Celery + Postgres.")
    p.add_argument("-A", "--app", default=os.environ.get("HARVEST_APP"),
                   help="module[:attr] of a Harvest instance, like celery -A (env HARVEST_APP)")
    p.add_argument("--database-url", default=os.environ.get("HARVEST_DATABASE_URL"),
                   help="database for commands that only need the database (env HARVEST_DATABASE_URL)")
    # The same options after the command name (harvest worker -A myshop.celery); SUPPRESS keeps a
    # value given before the command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-A", "--app", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--database-url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help)

    for add in (_setup_commands, _run_commands, _operator_commands, _read_commands,
                partial(replay_commands, app=_harvest, store=_store)):
        add(command, common)
    return p


class Command(Protocol):
    """Adds one subcommand (with the shared -A/--database-url options) and returns its parser."""

    def __call__(self, name: str, help: str) -> argparse.ArgumentParser: ...


def _setup_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """db upgrade, worker."""
    db = command("db", help="database schema")
    db.set_defaults(help_parser=db)
    db_sub = db.add_subparsers(title="db commands", metavar="DB_COMMAND")
    up = db_sub.add_parser("upgrade", parents=[common], help="apply the schema migrations (alembic upgrade)")
    up.add_argument("--revision", default="head")
    up.set_defaults(handler=cmd_db_upgrade)

    w = command("worker", help="run a Celery worker for the --app (decisions and activities)")
    w.usage = (f"{PROG} worker [-A APP] [-Q QUEUES] [--metrics-port PORT] [--metrics-addr ADDR]"
               " [CELERY WORKER OPTION ...]")
    w.epilog = ("Every other option goes to 'celery worker' unchanged (-n, -E, -c, -P, -l, -O fair, "
                "--without-gossip, ...; see 'celery worker --help'). Without -n the node name is "
                "harvest-decide@%h for a worker of the decision queue alone, else "
                "harvest-<queues joined by '-'>@%h; without -l/--loglevel the level is INFO.")
    # An abbreviation must not take a Celery option for one of harvest's (--q, --metrics, ...).
    w.allow_abbrev = False
    w.add_argument("-Q", "--queues", default=None,
                   help="comma-separated queues (default: 'default' and the decision queue 'harvest')")
    w.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus /metrics (aggregated over the pool processes) on this port")
    w.add_argument("--metrics-addr", default=None,
                   help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 in a container)")
    w.set_defaults(handler=cmd_worker, celery_args=[])


def _run_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """start, show, cancel, request-cancel, signal."""
    s = command("start", help="start a workflow run; prints its id")
    s.add_argument("workflow")
    s.add_argument("input", nargs="?", default=None, metavar="INPUT_JSON")
    s.add_argument("--id", dest="execution_id", default=None, help="execution id (idempotent start)")
    s.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help="wait this long for the result")
    s.set_defaults(handler=cmd_start)

    sh = command("show", help="status and history timeline of a run")
    sh.add_argument("execution_id", metavar="ID")
    sh.set_defaults(handler=cmd_show)

    c = command("cancel", help="cancel a live run (never compensates by itself)")
    c.add_argument("execution_id", metavar="ID")
    c.add_argument("--reason", default="")
    c.set_defaults(handler=cmd_cancel)

    rc = command("request-cancel", help="cooperative cancel: the run stays live (CANCELLING) and "
                                        "its cancel branch may run durable compensations")
    rc.add_argument("execution_id", metavar="ID")
    rc.add_argument("--reason", default="")
    rc.set_defaults(handler=cmd_request_cancel)

    sg = command("signal", help="send a signal to a live run")
    sg.add_argument("execution_id", metavar="ID")
    sg.add_argument("name", metavar="NAME")
    sg.add_argument("payload", nargs="?", default=None, metavar="PAYLOAD_JSON")
    sg.set_defaults(handler=cmd_signal)


def _operator_commands(command: Command, common: argparse.ArgumentParser) -> None:
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
    rs.add_argument("--to-seq", type=int, required=True, metavar="N",
                    help="how many leading events of the run to keep")
    rs.add_argument("--new-id", default=None, help="the new run's id (default: a fresh one)")
    rs.set_defaults(handler=cmd_reset)

    rt = command("retry", help="retry a failed DAG run from a node; prints the plan and the new run's id")
    rt.add_argument("dag", metavar="DAG")
    rt.add_argument("execution_id", metavar="ID")
    rt.add_argument("--from-node", default=None, metavar="NODE",
                    help="the node to re-run from (default: the first failed node)")
    rt.add_argument("--new-id", default=None, help="the new run's id (default: a fresh one)")
    rt.add_argument("--dry-run", action="store_true", help="print the plan without starting a run")
    rt.set_defaults(handler=cmd_retry)

    er = command("erase", help="erase the payloads of a terminal run (PII erasure; irreversible)")
    er.add_argument("execution_id", metavar="ID")
    er.add_argument("--with-forks", action="store_true", help="also erase its fork family")
    er.set_defaults(handler=cmd_erase)

    pg = command("purge", help="delete terminal runs closed more than DAYS days ago")
    pg.add_argument("--older-than", type=float, required=True, metavar="DAYS")
    pg.add_argument("--batch", type=int, default=500, metavar="N", help="runs deleted per transaction")
    pg.set_defaults(handler=cmd_purge)


def _read_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """list, result, api, demo."""
    ls = command("list", help="list runs, newest first")
    ls.add_argument("--status", default=None, type=str.upper)
    ls.add_argument("--workflow", default=None)
    ls.add_argument("--nd-blocked", action="store_true", help="only runs blocked on a replay divergence")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(handler=cmd_list)

    r = command("result", help="wait for a run and print its result as JSON")
    r.add_argument("execution_id", metavar="ID")
    r.add_argument("--timeout", type=float, default=30.0)
    r.set_defaults(handler=cmd_result)

    a = command("api", help="serve the operator HTTP API for the --app (needs the [api] extra)")
    a.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    a.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    a.add_argument("--insecure-no-auth", action="store_true",
                   help="serve without HARVEST_API_TOKEN: anyone may read and change runs, so it "
                        "binds to loopback only")
    a.set_defaults(handler=cmd_api)

    d = command("demo", help="run the example workflows in embedded mode (no Postgres, no Redis)")
    d.add_argument("--keep", action="store_true", help="keep the demo's SQLite database and print its path")
    d.set_defaults(handler=cmd_demo)


def parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON ({exc}): {text!r}") from None


# ── resolving the app and the database ───────────────────────────────────────────────────────
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


def _harvest(args: argparse.Namespace) -> Harvest:
    if not args.app:
        raise CliError(f"'{PROG} {args.handler.__name__[4:]}' needs --app module:attr (or HARVEST_APP) naming "
                       "the Harvest instance whose workflows it runs")
    return load_app(args.app)[0]


def _database_url(args: argparse.Namespace) -> str:
    if args.database_url:
        return str(args.database_url)
    if args.app:
        return load_app(args.app)[0].database_url
    raise CliError("no database: pass --database-url (or set HARVEST_DATABASE_URL), or --app")


def _store(args: argparse.Namespace) -> Store:
    if args.app and not args.database_url:
        return load_app(args.app)[0].store
    return Store(_database_url(args))


def _safe_url(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only used for display
        return url


# ── commands ─────────────────────────────────────────────────────────────────────────────────
def cmd_db_upgrade(args: argparse.Namespace) -> int:
    url = _database_url(args)
    upgrade(url, args.revision)
    print(f"database {_safe_url(url)} upgraded to {args.revision}")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    data = parse_json(args.input, "INPUT_JSON")
    harvest = _harvest(args)
    execution_id = harvest.start_workflow(args.workflow, data, execution_id=args.execution_id)
    print(execution_id)
    if args.wait is not None:
        return _print_result(harvest, execution_id, args.wait)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    execution = store.get(args.execution_id)
    for line in render_status(execution):
        print(line)
    for hint in _waiting(args, store):
        print("  " + waiting_line(hint, args.app))
    print("  timeline:")
    for line in render_timeline(store.history(args.execution_id)):
        print("  " + line)
    errors = render_errors(store.attempt_errors(args.execution_id))
    if errors:
        print("  errors (every attempt):\n" + "\n".join("  " + line for line in errors))
    return 0


def _waiting(args: argparse.Namespace, store: Store) -> list[dict[str, Any]]:
    """What the run waits on that no live worker takes (needs --app: its Celery app is asked)."""
    if not args.app:
        return []
    harvest = load_app(args.app)[0]
    if harvest.database_url != store.database_url:
        return []
    return harvest.stuck(args.execution_id) or []


def waiting_line(hint: dict[str, Any], app: str) -> str:
    what = f"activity {hint['activity']}" if hint["kind"] == "activity" else "a decision"
    queue = hint["queue"]
    return (f"waiting: {what} on queue {queue!r} for {hint['waiting_seconds']:.0f}s — no live worker "
            f"consumes {queue!r} (start one: {PROG} worker -A {app} -Q {queue})")


def cmd_cancel(args: argparse.Namespace) -> int:
    harvest = _harvest(args)
    status = harvest.cancel_workflow_execution(args.execution_id, reason=args.reason)
    print(f"{args.execution_id} {status}")
    return 0


def cmd_request_cancel(args: argparse.Namespace) -> int:
    harvest = _harvest(args)
    recorded = harvest.request_cancellation(args.execution_id, reason=args.reason)
    print(f"{args.execution_id} {harvest.describe(args.execution_id).display_status}"
          + ("" if recorded else " (a cancellation was already requested)"))
    return 0


def cmd_terminate(args: argparse.Namespace) -> int:
    harvest = _harvest(args)
    harvest.terminate(args.execution_id, reason=args.reason)
    print(f"{args.execution_id} {harvest.describe(args.execution_id).status}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    _harvest(args).pause(args.execution_id)
    print(f"paused {args.execution_id}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    _harvest(args).resume(args.execution_id)
    print(f"resumed {args.execution_id}")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    if args.to_seq < 1:
        raise CliError("--to-seq must be at least 1")
    new_id = _harvest(args).reset(args.execution_id, args.to_seq, new_execution_id=args.new_id)
    print(new_id)
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    answer = _harvest(args).retry_dag_run(args.dag, args.execution_id, args.from_node,
                                          dry_run=args.dry_run, new_execution_id=args.new_id)
    print(f"retry of {answer['source_run_id']} from node {answer['retry_from']}")
    print(f"  carried: {', '.join(answer['carried']) or '(none)'}")
    print(f"  rerun:   {', '.join(answer['rerun']) or '(none)'}")
    print("dry run: no run started" if answer["run_id"] is None else answer["run_id"])
    return 0


def cmd_erase(args: argparse.Namespace) -> int:
    counts = _harvest(args).erase_payloads(args.execution_id, with_forks=args.with_forks)
    print(f"erased {args.execution_id}: {counts['fields']} payload fields in {counts['events']} "
          f"events, {counts['blobs']} blobs deleted")
    if counts["forks"]:
        print(f"  with its fork family: {', '.join(counts['forks'])}")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    if not 0 <= args.older_than <= 36500:  # also refuses nan
        raise CliError("--older-than must be a number of days between 0 and 36500")
    if args.batch < 1:
        raise CliError("--batch must be at least 1")
    counts = _harvest(args).purge(args.older_than, args.batch)
    print(f"purged {counts['runs']} runs closed more than {args.older_than:g} days ago: "
          f"{counts['events']} events, {counts['blobs']} blobs")
    return 0


def cmd_signal(args: argparse.Namespace) -> int:
    payload = parse_json(args.payload, "PAYLOAD_JSON")
    harvest = _harvest(args)
    harvest.signal(args.execution_id, args.name, payload)
    print(f"signalled {args.execution_id}: {args.name}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1")
    rows = _store(args).list(status=args.status, workflow_type=args.workflow,
                             nd_blocked=True if args.nd_blocked else None, limit=args.limit)
    table = [("ID", "WORKFLOW", "STATUS", "CREATED", "CLOSED", "EVENTS", "ND-BLOCKED")]
    for x in rows:
        table.append((
            x.id, x.workflow_type, x.display_status[:72], _stamp(x.created_at), _stamp(x.closed_at),
            str(x.history_length), f"yes ({x.nd_block_count})" if x.nd_blocked else "",
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(no runs)")
    return 0


def _stamp(at: Any) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def cmd_result(args: argparse.Namespace) -> int:
    return _print_result(_harvest(args), args.execution_id, args.timeout)


def _print_result(harvest: Harvest, execution_id: str, timeout: float) -> int:
    try:
        value = harvest.result(execution_id, timeout=timeout)
    except TimeoutError as exc:
        raise CliError(str(exc)) from None
    except (WorkflowFailed, WorkflowCancelledError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(value))
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    """Every endpoint but /healthz needs ``$HARVEST_API_TOKEN``; without it the API refuses to
    start, unless ``--insecure-no-auth``, which binds to loopback only (``serving_token``)."""
    harvest = _harvest(args)
    try:
        import uvicorn

        from harvest_celery._web.api import create_app, serving_token
    except ImportError as exc:
        raise CliError(f"'{PROG} api' needs the api extra (pip install 'harvest-celery[api]'): {exc}") from None
    try:
        token = serving_token(os.environ.get("HARVEST_API_TOKEN"), args.host, insecure=args.insecure_no_auth)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    uvicorn.run(create_app(harvest, token=token), host=args.host, port=args.port)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(sys.stdout, keep=args.keep)


# ── worker ───────────────────────────────────────────────────────────────────────────────────
def celery_target(harvest: Harvest, module_name: str) -> str:
    """What ``celery -A`` should import: ``module:attr`` of the Harvest's Celery app. Celery
    cannot follow a dotted attribute, so the app must be a module-level name of the --app module;
    failing that, this module's ``celery_app`` (resolved lazily from ``HARVEST_APP``)."""
    module = sys.modules[module_name]
    for name, value in vars(module).items():
        if value is harvest.celery_app and not name.startswith("__"):
            return f"{module_name}:{name}"
    return f"{__name__}:celery_app"


def worker_argv(target: str, queues: list[str], decision_queue: str,
                celery_args: Sequence[str] = ()) -> list[str]:
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
        name = f"{name[:_NODE_NAME_MAX - 9].rstrip('-_.')}-{digest}"
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


def cmd_worker(args: argparse.Namespace) -> int:
    if not args.app:
        raise CliError(f"'{PROG} worker' needs -A/--app module[:attr] (or HARVEST_APP)")
    harvest, module_name, attr = load_app(args.app)
    if harvest.celery_app is None:
        raise CliError(f"--app {args.app!r} is in embedded mode (no celery_app): its worker runs "
                       "in-process; give the Harvest a Celery app to run 'harvest worker'")
    decision_queue = harvest.runtime.settings.decision_queue
    queues = worker_queues(args.queues, decision_queue)
    argv = worker_argv(celery_target(harvest, module_name), queues, decision_queue, args.celery_args)
    env = worker_env(dict(os.environ), f"{module_name}:{attr}", args)
    sys.stdout.flush()
    sys.stderr.flush()
    _exec(argv, env)
    return 0  # not reached


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
