"""The web console that ``harvest api`` serves at ``/console`` (docs/operations.md, "Console"):
a runs list with filters and paging, a page for any run (timeline, activities and attempts,
errors with tracebacks, saga markers and compensations, signals, the DAG graph of a DAG run),
live refresh while a run is open, and the operator actions, each a CSRF-protected form.

Everything it loads is served from the package (``harvest_celery/_web/static``, and Swagger UI
from ``fastapi-offline`` for ``/docs``): no CDN. ``routes`` registers it; ``html`` is the shell
and the escaping helpers; ``runs_page`` and ``run_page`` render; ``run_view`` folds a run's
history; ``actions`` performs the operator actions; ``docs`` serves the API docs offline.
"""

from harvest_celery._web.console.routes import register_console

__all__ = ["register_console"]
