"""harvest-celery for Django (docs/django.md).

``INSTALLED_APPS += ["harvest_celery.contrib.django"]`` and a ``HARVEST`` settings dict
(``conf``); then ``get_harvest()`` — or the ``harvest`` proxy — is the project's one
``Harvest``: ``workflows.py``/``activities.py`` of every installed app registered, starts joining
Django's transaction when ``HARVEST['DATABASE_ALIAS']`` names the harvest database.
``manage.py harvest …`` is the command line; ``http.HarvestErrorMiddleware`` answers errors as
JSON.

Nothing here touches Django's settings at import: the ``Harvest`` is built on first use.
"""

from __future__ import annotations

from typing import Any

from harvest_celery.contrib.django.conf import get_harvest, reset


class _LazyHarvest:
    """``harvest.start_workflow(...)`` etc. on ``get_harvest()``, resolved at each use."""

    def __getattr__(self, name: str) -> Any:
        return getattr(get_harvest(), name)

    def __repr__(self) -> str:
        return "<the project's Harvest (harvest_celery.contrib.django.get_harvest())>"


harvest: Any = _LazyHarvest()

__all__ = ["get_harvest", "harvest", "reset"]
