"""The operator assets stay true to the code: config/celeryconfig.py matches configure_dedicated_celery_app,
docker-compose.yml has its services, and the docs import only names harvest_celery exports."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from celery import Celery

import harvest_celery
from harvest_celery import configure_dedicated_celery_app

ROOT = Path(__file__).resolve().parents[2]


def test_celeryconfig_matches_configure_dedicated_celery_app() -> None:
    spec = importlib.util.spec_from_file_location("example_celeryconfig", ROOT / "config" / "celeryconfig.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = Celery("probe", set_as_current=False)
    configure_dedicated_celery_app(app)
    for key in (
        "task_acks_late",
        "task_reject_on_worker_lost",
        "worker_prefetch_multiplier",
        "task_default_queue",
        "task_ignore_result",
        "broker_connection_retry_on_startup",
        "worker_enable_prefetch_count_reduction",
    ):
        assert getattr(module, key) == app.conf[key], key


def test_the_dedicated_app_turns_off_celerys_prefetch_reduction_after_a_reconnect() -> None:
    """Celery 5.7's restoration of a reduced prefetch runs a synchronous basic.qos from a threads
    pool's acking thread and wedges the worker's consumer (tests/faults/test_rabbitmq.py)."""
    app = Celery("probe", set_as_current=False)
    assert app.conf.worker_enable_prefetch_count_reduction is True  # Celery's default
    configure_dedicated_celery_app(app)
    assert app.conf.worker_enable_prefetch_count_reduction is False


def test_settings_example_names_the_env_vars_from_env_reads() -> None:
    text = (ROOT / "config" / "settings.example.env").read_text()
    assert re.search(r"^HARVEST_DATABASE_URL=", text, re.M)
    assert re.search(r"^HARVEST_BROKER_URL=", text, re.M)


def test_compose_services() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    try:
        import yaml
    except ImportError:
        pytest.skip("PyYAML not installed")
    services = yaml.safe_load(text)["services"]
    assert {"postgres", "redis", "migrate", "decision-worker", "activity-worker", "api", "flower"} <= set(
        services
    )
    assert services["migrate"]["command"] == ["harvest", "db", "upgrade"]
    assert "-Q harvest,default" in " ".join(services["decision-worker"]["command"])
    assert "-Q payments,inventory,pricing,default" in " ".join(services["activity-worker"]["command"])


@pytest.mark.parametrize("doc", ["quickstart.md", "concepts.md", "operations.md"])
def test_docs_import_only_exported_names(doc: str) -> None:
    text = (ROOT / "docs" / doc).read_text()
    for block in re.findall(r"from harvest_celery import \(?([^)\n]*(?:\n[^)\n]*)*?)\)?\n", text):
        for name in re.split(r"[,\s]+", block.strip()):
            if name:
                assert hasattr(harvest_celery, name), f"{doc}: harvest_celery has no {name!r}"
