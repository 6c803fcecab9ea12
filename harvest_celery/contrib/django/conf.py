"""Django settings → one ``Harvest`` per process, built on first use (``get_harvest``).

Settings, in a ``HARVEST`` dict or as ``HARVEST_<KEY>`` settings (the dict wins)::

    HARVEST = {
        "DATABASE_ALIAS": "default",          # Django's alias of the harvest database: starts
                                              # join that connection's transaction
        "DATABASE_URL": None,                 # the harvest database as a SQLAlchemy URL; derived
                                              # from DATABASE_ALIAS when not given
        "CELERY_APP": "proj.celery:app",      # your Celery app (import path or the object)
        "BROKER_URL": None,                   # or: a Celery app is made for this broker
        "DECISION_QUEUE": "harvest",
        "AUTODISCOVER": True,                 # register <app>.workflows / <app>.activities
        "MODULES": [],                        # more modules (or objects) to register
        "POOL_SIZE": 2,                       # any Harvest(...) keyword, upper-cased: the
                                              # table of docs/configuration.md
        "OPTIONS": {},                        # or: more Harvest(...) keyword arguments
    }

With neither ``CELERY_APP`` nor ``BROKER_URL`` the engine runs in embedded mode (demo only).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._runtime.settings import KEYWORDS, framework_keywords
from harvest_celery.contrib.django.client import DjangoHarvest

DEFAULTS: dict[str, Any] = {
    "DATABASE_URL": None,
    "DATABASE_ALIAS": None,
    "CELERY_APP": None,
    "BROKER_URL": None,
    "DECISION_QUEUE": "harvest",
    "AUTODISCOVER": True,
    "MODULES": (),
    "OPTIONS": {},
}
# one key per Harvest(...) keyword (docs/configuration.md), passed only when set
KEYWORD_KEYS = tuple(keyword.name.upper() for keyword in KEYWORDS if keyword.name.upper() not in DEFAULTS)
DISCOVERED = ("workflows", "activities")
# connection parameters of Django's OPTIONS that libpq understands (kept in the derived URL)
_LIBPQ = {
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "application_name",
    "connect_timeout",
    "options",
    "target_session_attrs",
    "service",
    "passfile",
    "keepalives",
}
_LOCAL = {None, "", "localhost", "127.0.0.1", "::1"}


def _improperly(message: str) -> Exception:
    from django.core.exceptions import ImproperlyConfigured

    return ImproperlyConfigured(f"harvest_celery.contrib.django: {message}")


def harvest_settings() -> dict[str, Any]:
    """The effective settings: defaults, then ``HARVEST_<KEY>`` settings, then ``HARVEST``."""
    from django.conf import settings

    conf = dict(DEFAULTS)
    for key in (*DEFAULTS, *KEYWORD_KEYS):
        if hasattr(settings, f"HARVEST_{key}"):
            conf[key] = getattr(settings, f"HARVEST_{key}")
    given = getattr(settings, "HARVEST", None) or {}
    if not isinstance(given, dict):
        raise _improperly("HARVEST must be a dict")
    known = (*DEFAULTS, *KEYWORD_KEYS)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise _improperly(f"unknown HARVEST key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    conf.update(given)
    return conf


def url_for_alias(alias: str) -> str:
    """The SQLAlchemy URL (psycopg2: the engine's own driver) of a Django Postgres database."""
    from django.conf import settings
    from sqlalchemy.engine import URL

    try:
        db = settings.DATABASES[alias]
    except KeyError:
        raise _improperly(f"DATABASE_ALIAS {alias!r} is not in DATABASES") from None
    if "postgresql" not in db.get("ENGINE", ""):
        raise _improperly(
            f"DATABASE_ALIAS {alias!r} is {db.get('ENGINE')!r}: a start joins a "
            "Django transaction only on Postgres (use start_workflow_on_commit)"
        )
    options = db.get("OPTIONS") or {}
    query = {k: str(v) for k, v in options.items() if k in _LIBPQ and v is not None}
    return URL.create(
        "postgresql+psycopg2",
        username=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None,
        port=int(db["PORT"]) if db.get("PORT") else None,
        database=db.get("NAME"),
        query=query,
    ).render_as_string(hide_password=False)


def same_database(a: str, b: str) -> bool:
    """Whether two URLs name the same Postgres database (local host spellings are one)."""
    from sqlalchemy.engine import make_url

    x, y = make_url(a), make_url(b)

    def host(url: Any) -> Any:
        return "local" if url.host in _LOCAL else url.host

    return (host(x), x.port or 5432, x.database) == (host(y), y.port or 5432, y.database)


def database_url(conf: dict[str, Any]) -> str:
    url, alias = conf["DATABASE_URL"], conf["DATABASE_ALIAS"]
    if alias is None:
        if not url:
            raise _improperly(
                "set HARVEST['DATABASE_URL'] (the harvest database) or "
                "HARVEST['DATABASE_ALIAS'] (a Django database that is the harvest database)"
            )
        return str(url)
    derived = url_for_alias(alias)
    if url and not same_database(str(url), derived):
        raise _improperly(
            f"DATABASE_URL and DATABASE_ALIAS {alias!r} name different databases: "
            "a start joins the alias's transaction only if it is the harvest database"
        )
    return str(url or derived)


def resolve(spec: Any) -> Any:
    """An object, or its import path (``pkg.module:attr`` or ``pkg.module.attr``)."""
    if not isinstance(spec, str):
        return spec
    if ":" in spec:
        module_name, attr = spec.split(":", 1)
    else:
        module_name, _, attr = spec.rpartition(".")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def discover(names: Iterable[str] = DISCOVERED) -> list[ModuleType]:
    """``<app>.workflows`` and ``<app>.activities`` of every installed app that has one, like
    Celery's ``autodiscover_tasks`` (an error inside such a module is raised, not hidden)."""
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    found = []
    for config in apps.get_app_configs():
        for name in names:
            if module_has_submodule(config.module, name):
                found.append(importlib.import_module(f"{config.name}.{name}"))
    return found


# ── the one Harvest of the process ───────────────────────────────────────────────────────────
_lock = threading.Lock()
_instance: Harvest | None = None


def get_harvest() -> Harvest:
    """This process's ``Harvest``, built from the settings on first use (``django.setup()`` is
    called first if nothing has set Django up yet, e.g. in ``harvest worker``)."""
    global _instance
    if _instance is None:
        with _lock:
            if _instance is None:
                _ensure_django()
                _instance = build(harvest_settings())
    return _instance


def reset() -> None:
    """Forget the built ``Harvest`` (tests that change the settings)."""
    global _instance
    with _lock:
        _instance = None


def _ensure_django() -> None:
    from django.apps import apps

    if not apps.apps_ready and not apps.loading:
        import django

        django.setup()
    if not apps.models_ready:
        raise _improperly(
            "the Harvest was asked for while Django was still loading its apps; "
            "ask for it later (in a view, a task, or after AppConfig.ready)"
        )


def build(conf: dict[str, Any]) -> Harvest:
    celery_app = resolve(conf["CELERY_APP"]) if conf["CELERY_APP"] else None
    if celery_app is None and conf["BROKER_URL"]:
        from celery import Celery

        celery_app = Celery("harvest", broker=conf["BROKER_URL"])
        configure_dedicated_celery_app(celery_app)
    keys, options = framework_keywords(conf), dict(conf["OPTIONS"])
    twice = sorted(set(keys) & set(options))
    if twice:
        raise _improperly(f"{', '.join(twice)} set both as a HARVEST key and in HARVEST['OPTIONS']")
    harvest = DjangoHarvest(
        database_url(conf), celery_app, database_alias=conf["DATABASE_ALIAS"], **keys, **options
    )
    modules: list[Any] = discover() if conf["AUTODISCOVER"] else []
    modules += [resolve(m) for m in conf["MODULES"]]
    if modules:
        harvest.register(*modules)
    return harvest
