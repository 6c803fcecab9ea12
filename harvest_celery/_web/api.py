"""The historical import path of the operator API: re-exports ``create_app`` from
``harvest_celery._web.app`` (``harvest_celery.api`` and ``harvest api`` import it from here)."""

from harvest_celery._web.app import create_app

__all__ = ["create_app"]
