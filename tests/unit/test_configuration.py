"""One configuration surface (docs/configuration.md): its table against the code, every keyword
checked before anything connects, the pool sizes reaching both engines, the Django and Flask keys,
and ``configure_celery`` as a deprecated alias of ``configure_dedicated_celery_app``."""

from __future__ import annotations

import ast
import inspect
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

import harvest_celery
from harvest_celery import Harvest, Timings, configure_celery, configure_dedicated_celery_app
from harvest_celery._client import EMBEDDED_URL
from harvest_celery._runtime.runtime import Settings as SettingsFromRuntime
from harvest_celery._runtime.settings import BY_NAME, KEYWORDS, Settings, checked
from harvest_celery._store.dialect import Pools
from harvest_celery._web.hardening import DEFAULT_MAX_BODY

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "harvest_celery"
PG_URL = "postgresql+psycopg2://nobody@127.0.0.1:1/nowhere"  # nothing listens on port 1
POOL_ENV = [k.env for k in KEYWORDS if k.env]


@pytest.fixture(autouse=True)
def _no_pool_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in POOL_ENV:
        monkeypatch.delenv(name, raising=False)


# ── the table ────────────────────────────────────────────────────────────────────────────────
def _cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [re.sub(r"<[^>]+>", "", c).replace("\\|", "|").strip() for c in cells]


def table() -> list[dict[str, str]]:
    lines = (ROOT / "docs" / "configuration.md").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| Setting |"))
    names = _cells(lines[header])
    assert names == [
        "Setting",
        "Type",
        "Default",
        "`Harvest(...)` keyword",
        "Environment variable",
        "Django and Flask key",
        "What it does",
    ]
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) == len(names), line
        rows.append(
            dict(zip(["setting", "type", "default", "keyword", "env", "key", "does"], cells, strict=True))
        )
    return rows


def _code(cell: str) -> str | None:
    """The cell's first `literal`, or None for —."""
    found = re.match(r"`([^`]+)`", cell)
    if found is None:
        assert cell == "—", cell
        return None
    return found.group(1)


def _shown(cell: str) -> Any:
    text = _code(cell)
    assert text is not None
    return Timings() if text == "Timings()" else ast.literal_eval(text)


def _keyword_names() -> list[str]:
    parameters = inspect.signature(Harvest.__init__).parameters
    return [name for name in parameters if name != "self"]


def _env_reads() -> dict[str, Any]:
    """Every HARVEST_* variable the package reads through os.environ / os.getenv, with the
    literal default of the read when it has one (the name may be a module-level constant)."""
    found: dict[str, Any] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            args: list[ast.expr] = []
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
                args = node.args
            elif (
                isinstance(node, ast.Subscript)
                and ast.unparse(node.value) == "os.environ"
                and isinstance(node.ctx, ast.Load)
            ):
                args = [node.slice]
            if not args:
                continue
            first = args[0]
            name = first.value if isinstance(first, ast.Constant) else constants.get(getattr(first, "id", ""))
            if isinstance(name, str) and name.startswith("HARVEST_"):
                default = args[1].value if len(args) > 1 and isinstance(args[1], ast.Constant) else None
                found.setdefault(name, default)
    for keyword in KEYWORDS:  # read through the keyword table (settings.checked)
        if keyword.env:
            found[keyword.env] = None
    return found


def test_the_scan_finds_what_the_package_reads() -> None:
    reads = _env_reads()
    assert {
        "HARVEST_DATABASE_URL",
        "HARVEST_BROKER_URL",
        "HARVEST_APP",
        "HARVEST_API_TOKEN",
        "HARVEST_API_MAX_BODY_BYTES",
        "HARVEST_METRICS_PORT",
        "HARVEST_POOL_SIZE",
    } <= set(reads)
    assert reads["HARVEST_METRICS_ADDR"] == "127.0.0.1"
    assert not {"HARVEST_MODULES", "HARVEST_OPTIONS"} & set(reads)  # Flask config keys, not variables


def test_every_keyword_is_in_the_table_once_with_the_code_default() -> None:
    rows = table()
    keywords = [_code(r["keyword"]) for r in rows if _code(r["keyword"])]
    assert sorted(keywords) == sorted(_keyword_names())
    assert len(keywords) == len(set(keywords))
    effective = {**checked({}, environ={}), "database_url": EMBEDDED_URL, "celery_app": None}
    for row in rows:
        name = _code(row["keyword"])
        if name is not None:
            assert _shown(row["default"]) == effective[name], name


def test_every_environment_variable_is_in_the_table_once_with_the_code_default() -> None:
    rows = table()
    variables = [_code(r["env"]) for r in rows if _code(r["env"])]
    reads = _env_reads()
    assert sorted(variables) == sorted(reads)
    assert len(variables) == len(set(variables))
    explicit = {"HARVEST_API_MAX_BODY_BYTES": DEFAULT_MAX_BODY, "HARVEST_DATABASE_URL": EMBEDDED_URL}
    for row in rows:
        name = _code(row["env"])
        if name is None:
            continue
        keyword = BY_NAME.get(str(_code(row["keyword"])))
        expected = keyword.default if keyword else explicit.get(name, reads[name])
        assert _shown(row["default"]) == expected, name
        if keyword is not None:
            assert keyword.env == name


def test_every_keyword_has_its_django_and_flask_key() -> None:
    from harvest_celery.contrib import flask
    from harvest_celery.contrib.django import conf

    for row in table():
        name = _code(row["keyword"])
        if name is None:
            continue
        key = _code(row["key"])
        assert key == f"HARVEST_{name.upper()}", name
        if name in BY_NAME:
            bare = key.removeprefix("HARVEST_")
            assert bare in conf.DEFAULTS or bare in conf.KEYWORD_KEYS, name
    assert "CELERY_APP" in conf.DEFAULTS and "CELERY_APP" in flask.DEFAULTS


def test_the_signature_and_the_table_agree() -> None:
    parameters = inspect.signature(Harvest.__init__).parameters
    assert [n for n in _keyword_names() if n not in ("database_url", "celery_app")] == [
        k.name for k in KEYWORDS
    ]
    for keyword in KEYWORDS:
        default = parameters[keyword.name].default
        assert default is None or default == keyword.default, keyword.name
        assert parameters[keyword.name].annotation != "Any", keyword.name


# ── checked before anything connects ─────────────────────────────────────────────────────────
BAD = [
    ("celery_error_detail", "short", 'celery_error_detail accepts "full" or "type"'),
    ("pool_size", -1, "pool_size accepts a count of at least 1"),
    ("pool_size", 0, "pool_size accepts a count of at least 1"),  # 0 is "no limit" to SQLAlchemy
    ("max_overflow", -1, "max_overflow accepts a count of at least 0"),  # -1 is "unlimited"
    ("claim_pool_size", 0, "claim_pool_size accepts"),
    ("claim_max_overflow", 2.5, "claim_max_overflow accepts"),
    ("eager_max_chain", -1, "eager_max_chain accepts"),
    ("sticky_sessions", "yes", "sticky_sessions accepts True or False"),
    ("inline_decisions", 1, "inline_decisions accepts True or False"),
    ("max_sessions", True, "max_sessions accepts"),
    ("sweep_interval", 0, "sweep_interval accepts seconds above 0"),
    ("decision_queue", "", "decision_queue accepts a non-empty queue name"),
    ("timings", {"default_lease": 1}, "timings accepts a harvest_celery.Timings"),
    ("codec", object(), "codec accepts a Codec"),
    ("payload_store", "s3://bucket", "payload_store accepts a PayloadStore"),
    ("max_activity_input_bytes", -1, "max_activity_input_bytes accepts"),
    ("offload_threshold", "1MB", "offload_threshold accepts a byte count"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_bad_value_raises_its_value_error_before_any_connection(
    monkeypatch: pytest.MonkeyPatch, name: str, value: Any, message: str
) -> None:
    made: list[str] = []
    real = sa.create_engine

    def create_engine(url: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(str(url))
        return real(url, *args, **kwargs)

    monkeypatch.setattr(sa, "create_engine", create_engine)
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        Harvest(PG_URL, Celery("bad", set_as_current=False), **{name: value})
    assert f"Harvest({name}=" in str(raised.value)
    assert made == []  # no engine was even made, so nothing could connect


def test_the_same_unreachable_url_with_good_values_fails_only_when_used() -> None:
    harvest = Harvest(PG_URL, pool_size=1)
    with pytest.raises(sa.exc.OperationalError):
        harvest.store.ping()


def test_a_bad_pool_variable_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARVEST_MAX_OVERFLOW", "lots")
    with pytest.raises(ValueError, match=r"HARVEST_MAX_OVERFLOW='lots': max_overflow accepts"):
        Harvest(PG_URL)
    monkeypatch.setenv("HARVEST_MAX_OVERFLOW", "-3")
    with pytest.raises(ValueError, match=r"HARVEST_MAX_OVERFLOW='-3'"):
        Harvest(PG_URL)


# ── where the values go ──────────────────────────────────────────────────────────────────────
def _pool(engine: sa.Engine) -> tuple[int, int]:
    pool: Any = engine.pool
    return pool.size(), pool._max_overflow


def test_the_defaults_are_unchanged() -> None:
    harvest = Harvest(PG_URL)
    # the connection budget (docs/operations.md#connection-pools): 8 + 6 + 1 per process at most,
    # no overflow (an overflow connection is closed when given back: a backend start per use)
    assert harvest.store.pools == Pools(size=8, overflow=0, claim_size=6, claim_overflow=0)
    assert _pool(harvest.store.engine) == (8, 0)
    assert _pool(harvest.store.autocommit_engine) == (6, 0)
    settings = harvest.runtime.settings
    assert (
        settings.decision_queue,
        settings.sweep_interval,
        settings.celery_error_detail,
        settings.eager_max_chain,
        settings.inline_decisions,
        settings.inline_cold_max_events,
        settings.sticky_sessions,
        settings.sticky_routing,
        settings.max_sessions,
    ) == ("harvest", 1.0, "full", 8, True, 500, True, True, 1000)
    assert settings.timings == Timings()
    assert settings.engine.max_activity_input_bytes == 2 * 1024 * 1024
    assert harvest.store.payloads.offload_threshold is None  # no store: nothing offloads


def test_the_pool_sizes_reach_both_engines() -> None:
    harvest = Harvest(PG_URL, pool_size=3, max_overflow=4, claim_pool_size=1, claim_max_overflow=2)
    assert _pool(harvest.store.engine) == (3, 4)
    assert _pool(harvest.store.autocommit_engine) == (1, 2)


def test_the_pool_variables_apply_when_the_keyword_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARVEST_POOL_SIZE", "2")
    monkeypatch.setenv("HARVEST_CLAIM_MAX_OVERFLOW", "3")
    harvest = Harvest(PG_URL, claim_max_overflow=7)  # the keyword wins
    monkeypatch.setenv("HARVEST_MAX_OVERFLOW", "9")
    harvest = Harvest(PG_URL, claim_max_overflow=7)
    assert harvest.store.pools == Pools(size=2, overflow=9, claim_size=6, claim_overflow=7)
    assert _pool(harvest.store.engine) == (2, 9)


def test_every_runtime_keyword_reaches_the_runtime_settings() -> None:
    given = {
        "decision_queue": "q",
        "sweep_interval": 0.5,
        "celery_error_detail": "type",
        "eager_max_chain": 0,
        "inline_decisions": False,
        "inline_cold_max_events": 7,
        "sticky_sessions": False,
        "sticky_routing": False,
        "max_sessions": 3,
        "timings": Timings(default_lease=5.0),
    }
    harvest = Harvest(PG_URL, **given)
    settings = harvest.runtime.settings
    assert {name: getattr(settings, name) for name in given} == given
    assert harvest.runtime.sessions.size == 3
    assert (
        Harvest(PG_URL, max_activity_input_bytes=None).runtime.settings.engine.max_activity_input_bytes
        is None
    )


def test_runtime_settings_are_still_settable_and_importable_from_runtime() -> None:
    assert SettingsFromRuntime is Settings
    harvest = Harvest(PG_URL)
    harvest.runtime.settings.celery_error_detail = "type"  # what users did before the keyword
    assert harvest.runtime.settings.celery_error_detail == "type"


# ── Django and Flask keys ────────────────────────────────────────────────────────────────────
def test_flask_keys_become_keywords() -> None:
    from flask import Flask

    from harvest_celery.contrib.flask import FlaskHarvest

    app = Flask("shop")
    app.config.update(
        HARVEST_DATABASE_URL=PG_URL,
        HARVEST_POOL_SIZE=3,
        HARVEST_CELERY_ERROR_DETAIL="type",
        HARVEST_OPTIONS={"sweep_interval": 0.5},
    )
    ext = FlaskHarvest(app)
    harvest = app.extensions["harvest"].harvest
    assert harvest.store.pools.size == 3 and harvest.runtime.settings.celery_error_detail == "type"
    assert harvest.runtime.settings.sweep_interval == 0.5
    twice = Flask("twice")
    twice.config.update(HARVEST_DATABASE_URL=PG_URL, HARVEST_POOL_SIZE=3, HARVEST_OPTIONS={"pool_size": 4})
    with pytest.raises(RuntimeError, match="pool_size set both"):
        ext.init_app(twice)
    bad = Flask("bad")
    bad.config.update(HARVEST_DATABASE_URL=PG_URL, HARVEST_STICKY_ROUTING="no")
    with pytest.raises(ValueError, match="sticky_routing accepts True or False"):
        ext.init_app(bad)


def test_django_keys_become_keywords() -> None:
    from harvest_celery.contrib.django import conf

    settings = {
        **conf.DEFAULTS,
        "DATABASE_URL": PG_URL,
        "POOL_SIZE": 3,
        "CLAIM_POOL_SIZE": 1,
        "MAX_SESSIONS": 9,
        "AUTODISCOVER": False,
        "OPTIONS": {"eager_max_chain": 2},
    }
    harvest = conf.build(settings)
    assert harvest.store.pools == Pools(size=3, overflow=0, claim_size=1, claim_overflow=0)
    assert (harvest.runtime.settings.max_sessions, harvest.runtime.settings.eager_max_chain) == (9, 2)
    assert {"POOL_SIZE", "CELERY_ERROR_DETAIL", "CODEC", "PAYLOAD_STORE"} <= set(conf.KEYWORD_KEYS)
    with pytest.raises(Exception, match="MAX_SESSIONS|max_sessions set both"):
        conf.build({**settings, "OPTIONS": {"max_sessions": 1}})


# ── the Celery app ───────────────────────────────────────────────────────────────────────────
def test_configure_celery_warns_and_sets_what_the_new_name_sets() -> None:
    old, new = Celery("old", set_as_current=False), Celery("new", set_as_current=False)
    untouched = dict(Celery("plain", set_as_current=False).conf)
    with pytest.warns(DeprecationWarning, match="configure_dedicated_celery_app"):
        configure_celery(old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        configure_dedicated_celery_app(new)
    changed = {k for k, v in dict(new.conf).items() if untouched.get(k) != v}
    assert changed >= {"task_acks_late", "task_default_queue", "worker_prefetch_multiplier"}
    assert dict(old.conf) == dict(new.conf)
    assert {k: old.conf[k] for k in changed} == {k: new.conf[k] for k in changed}
    assert "only for harvest" in " ".join((configure_dedicated_celery_app.__doc__ or "").split())
    assert {"configure_celery", "configure_dedicated_celery_app", "Timings", "Codec", "PayloadStore"} <= set(
        harvest_celery.__all__
    )


def test_the_package_calls_the_new_name() -> None:
    for path in [
        PACKAGE / "_client.py",
        PACKAGE / "contrib" / "flask.py",
        PACKAGE / "contrib" / "django" / "conf.py",
    ]:
        text = path.read_text()
        assert "configure_dedicated_celery_app(celery_app)" in text, path
        assert "configure_celery(" not in text, path
