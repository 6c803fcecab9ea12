"""harvest-celery for Flask (docs/flask.md): the ``FlaskHarvest`` extension.

::

    db = SQLAlchemy()                      # optional: Flask-SQLAlchemy on the harvest database
    harvest = FlaskHarvest(db=db, celery_app=celery)

    def create_app():
        app = Flask(__name__)
        app.config.from_mapping(SQLALCHEMY_DATABASE_URI=..., HARVEST_MODULES=["shop.workflows"])
        db.init_app(app)
        harvest.init_app(app)
        return app

Config keys (``HARVEST_<KEY>``): ``DATABASE_URL`` (default: ``SQLALCHEMY_DATABASE_URI`` when a
``db`` is given), ``CELERY_APP`` (object or import path; or ``celery_app=``), ``BROKER_URL``,
one key per ``Harvest(...)`` keyword (``HARVEST_DECISION_QUEUE``, ``HARVEST_POOL_SIZE``…: the
table of docs/configuration.md), ``MODULES`` (modules or objects to register), ``OPTIONS`` (more
``Harvest`` keyword arguments), ``TRANSACTIONAL_START`` (start inside ``db.session``'s transaction; default:
when ``db``'s database is the harvest database), ``ERROR_HANDLERS`` (default True: every
``HarvestError`` answers the HTTP API's JSON body and status).

``flask harvest …`` is the ``harvest`` command line on the app's ``Harvest``.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import click
from flask import Flask, current_app, has_app_context, jsonify
from flask.cli import ScriptInfo, with_appcontext

from harvest_celery._cli import main
from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._errors import HarvestError, error_body, http_status
from harvest_celery._runtime.settings import framework_keywords

DEFAULTS: dict[str, Any] = {
    "DATABASE_URL": None,
    "CELERY_APP": None,
    "BROKER_URL": None,
    "DECISION_QUEUE": "harvest",
    "MODULES": (),
    "OPTIONS": {},
    "TRANSACTIONAL_START": None,
    "ERROR_HANDLERS": True,
}
EXTENSION = "harvest"
APP_SPEC = "harvest_celery.contrib.flask:current_harvest"


@dataclass
class _State:
    harvest: Harvest
    session: Any  # db.session when starts join its transaction, else None


class FlaskHarvest:
    """The extension: one ``Harvest`` per Flask app, built by ``init_app`` from its config.
    Attribute access (``signal``, ``cancel_workflow_execution``, ``result``, ``describe``…)
    goes to the current app's ``Harvest``."""

    def __init__(
        self,
        app: Flask | None = None,
        *,
        db: Any = None,
        celery_app: Any = None,
        harvest: Harvest | None = None,
    ) -> None:
        self.db = db
        self.celery_app = celery_app
        self._given = harvest
        # one Harvest per process and database: apps made by one factory (tests) share it
        self._built: dict[tuple[Any, ...], Harvest] = {}
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        for key, default in DEFAULTS.items():
            app.config.setdefault(f"HARVEST_{key}", default)
        harvest = self._given or self._build(app)
        app.extensions[EXTENSION] = _State(
            harvest, self.db.session if self._transactional(app, harvest) else None
        )
        if app.config["HARVEST_ERROR_HANDLERS"]:
            app.register_error_handler(HarvestError, error_response)
        app.cli.add_command(harvest_command)

    def _build(self, app: Flask) -> Harvest:
        cfg = app.config
        url = cfg["HARVEST_DATABASE_URL"]
        if not url and self.db is not None and cfg.get("SQLALCHEMY_DATABASE_URI"):
            url = _engine_url(cfg["SQLALCHEMY_DATABASE_URI"])
        if not url:
            raise RuntimeError(
                "FlaskHarvest: set HARVEST_DATABASE_URL (or give db= with "
                "SQLALCHEMY_DATABASE_URI on the harvest database)"
            )
        celery_app = _resolve(cfg["HARVEST_CELERY_APP"] or self.celery_app)
        if celery_app is None and cfg["HARVEST_BROKER_URL"]:
            from celery import Celery

            celery_app = Celery(app.import_name, broker=cfg["HARVEST_BROKER_URL"])
            configure_dedicated_celery_app(celery_app)
        keys = framework_keywords(cfg, "HARVEST_")
        key = (url, id(celery_app), repr(sorted(keys.items(), key=lambda item: item[0])))
        harvest = self._built.get(key)
        if harvest is None:
            harvest = self._built[key] = Harvest(url, celery_app, **_keywords(keys, cfg["HARVEST_OPTIONS"]))
        modules = [_resolve(m) for m in cfg["HARVEST_MODULES"]]
        if modules:
            harvest.register(*modules)
        return harvest

    def _transactional(self, app: Flask, harvest: Harvest) -> bool:
        setting = app.config["HARVEST_TRANSACTIONAL_START"]
        if self.db is None:
            if setting:
                raise RuntimeError("FlaskHarvest: HARVEST_TRANSACTIONAL_START needs db=")
            return False
        if setting is not None:
            return bool(setting)
        uri = app.config.get("SQLALCHEMY_DATABASE_URI")
        return bool(uri) and _same_database(str(uri), harvest.database_url)

    # ── the current app's Harvest ────────────────────────────────────────────────────────────
    @property
    def harvest(self) -> Harvest:
        return _state().harvest

    def start_workflow(
        self,
        name: str,
        input: Any = None,
        execution_id: str | None = None,
        *,
        connection: Any = None,
        id_reuse: str = "idempotent",
    ) -> str:
        """``Harvest.start_workflow``, inside ``db.session``'s transaction when the app's database
        is the harvest database (``HARVEST_TRANSACTIONAL_START``): commit the session and the run
        is started; roll it back and it never existed."""
        state = _state()
        if connection is None:
            connection = state.session
        return state.harvest.start_workflow(
            name, input, execution_id, connection=connection, id_reuse=id_reuse
        )

    def start_workflow_on_commit(
        self,
        name: str,
        input: Any = None,
        execution_id: str | None = None,
        *,
        session: Any = None,
        id_reuse: str = "idempotent",
    ) -> str:
        """Start once ``db.session`` (or ``session``) commits — for an app whose database is not
        the harvest database; the weaker guarantee of ``Harvest.start_workflow_on_commit``."""
        if session is None and self.db is not None:
            session = self.db.session
        if session is None:
            raise RuntimeError("start_workflow_on_commit needs a session: give FlaskHarvest db=")
        return _state().harvest.start_workflow_on_commit(
            name, input, execution_id, session=session, id_reuse=id_reuse
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(_state().harvest, name)


def _keywords(keys: dict[str, Any], options: Any) -> dict[str, Any]:
    """``Harvest`` keywords: the ``HARVEST_<KEYWORD>`` keys (docs/configuration.md) and
    ``HARVEST_OPTIONS``; one keyword given both ways is refused."""
    more = dict(options)
    twice = sorted(set(keys) & set(more))
    if twice:
        raise RuntimeError(
            f"FlaskHarvest: {', '.join(twice)} set both as HARVEST_<KEY> and in HARVEST_OPTIONS"
        )
    return {**keys, **more}


def _state() -> _State:
    state = current_app.extensions.get(EXTENSION)
    if state is None:
        raise RuntimeError("FlaskHarvest.init_app(app) was not called for this app")
    return state  # type: ignore[no-any-return]


def current_harvest() -> Harvest:
    """The ``Harvest`` of the current Flask app; outside an app context (the ``celery worker``
    that ``flask harvest worker`` starts), of the app ``HARVEST_FLASK_APP`` names."""
    if has_app_context():
        return _state().harvest
    app = ScriptInfo(app_import_path=os.environ.get("HARVEST_FLASK_APP") or None).load_app()
    with app.app_context():
        return _state().harvest


def error_response(exc: HarvestError) -> Any:
    """A ``HarvestError`` as the HTTP API answers it: ``{"error", "detail"}`` (+ ``reason`` /
    ``conflict``) with 404, 409, 400 or 503 (docs/errors.md)."""
    return jsonify(error_body(exc)), http_status(exc)


@click.command(
    "harvest",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@with_appcontext
def harvest_command(args: tuple[str, ...]) -> None:
    """The harvest command line on this app's Harvest (flask harvest --help)."""
    info = click.get_current_context().find_object(ScriptInfo)
    if info is not None and info.app_import_path:
        os.environ["HARVEST_FLASK_APP"] = info.app_import_path  # for `flask harvest worker`
    code = main(["--app", APP_SPEC, *args])
    if code:
        sys.exit(code)


def _resolve(spec: Any) -> Any:
    if not isinstance(spec, str):
        return spec
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
        if not module_name:
            return importlib.import_module(spec)
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr) if attr else module
    except AttributeError:
        return importlib.import_module(spec)  # a dotted module path


def _engine_url(uri: str) -> str:
    """The harvest engine's URL for the app's database: the same database on psycopg2."""
    from sqlalchemy.engine import make_url

    url = make_url(uri)
    if url.get_backend_name() != "postgresql":
        return uri
    return url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)


def _same_database(a: str, b: str) -> bool:
    from sqlalchemy.engine import make_url

    x, y = make_url(a), make_url(b)
    local = {None, "", "localhost", "127.0.0.1", "::1"}

    def key(url: Any) -> tuple[Any, ...]:
        host = "local" if url.host in local else url.host
        return url.get_backend_name(), host, url.port or 5432, url.database

    return key(x) == key(y)


__all__ = ["FlaskHarvest", "current_harvest", "error_response", "harvest_command"]
