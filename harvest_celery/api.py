"""The operator HTTP API (needs the ``api`` extra): ``create_app(harvest)`` or ``harvest api``."""

from harvest_celery._web.api import create_app

__all__ = ["create_app"]
