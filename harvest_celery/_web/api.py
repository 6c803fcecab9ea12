"""The historical import path of the operator API: re-exports ``create_app`` (and
``serving_token``, what ``harvest api`` serves with) from ``harvest_celery._web.app``
(``harvest_celery.api`` and ``harvest api`` import it from here)."""

from harvest_celery._web.app import create_app, serving_token

__all__ = ["create_app", "serving_token"]
