"""The Django app: ``INSTALLED_APPS = [..., "harvest_celery.contrib.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig

from harvest_celery.contrib.django.conf import get_harvest, harvest_settings


class HarvestConfig(AppConfig):
    """Checks the ``HARVEST`` settings at start-up (a typo fails ``manage.py check``, not the
    first request) and, when a Celery app is configured, builds the ``Harvest`` as a Celery
    worker of this project starts (``celeryd_init``), so its tasks are registered before the
    worker consumes. Web processes build it lazily, on the first ``get_harvest()``."""

    name = "harvest_celery.contrib.django"
    label = "harvest_celery"
    verbose_name = "harvest-celery"
    default = True

    def ready(self) -> None:
        conf = harvest_settings()
        if conf["CELERY_APP"] is None and conf["BROKER_URL"] is None:
            return
        try:
            from celery import signals
        except ImportError:  # pragma: no cover - celery is a dependency
            return
        signals.celeryd_init.connect(
            _build_for_worker, weak=False, dispatch_uid="harvest_celery.contrib.django"
        )


def _build_for_worker(sender: Any = None, **_kw: Any) -> None:
    get_harvest()
