"""Database errors in harvest's own logs, without the values they quote.

The engines never log SQL parameters (``hide_parameters``), but Postgres itself quotes them:
with psycopg2 the parameters are sent inside the statement text, and an error's ``LINE n:``,
``DETAIL`` and ``CONTEXT`` parts show the offending value — a payload, a card number. A filter
on harvest's loggers replaces such an error (anywhere in the logged exception's chain) with its
primary message, which names the problem but no value. Logs written by other libraries
(Celery's own "task raised" line) are theirs and are not touched: docs/operations.md says so.
"""

from __future__ import annotations

import logging

LOGGERS = ("harvest_celery", "harvest_celery.api")


class RedactedDatabaseError(Exception):
    """What a logged database error becomes: its class and primary message, no values."""


def redacted(exc: BaseException) -> BaseException:
    """``exc`` itself, or a ``RedactedDatabaseError`` if a driver error in its chain carries
    Postgres diagnostics (the parts that can quote values)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        cause = getattr(link, "orig", None) or link
        diag = getattr(cause, "diag", None)
        if diag is not None and hasattr(diag, "message_primary"):
            primary = diag.message_primary or "database error"
            return RedactedDatabaseError(
                f"{type(exc).__name__} ({type(cause).__name__}): {primary} [statement and values not logged]"
            )
        link = link.__cause__ or link.__context__
    return exc


class RedactDatabaseErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            shown = redacted(record.exc_info[1])
            if shown is not record.exc_info[1]:
                record.exc_info = (type(shown), shown, record.exc_info[2])
                record.exc_text = None
        return True


def install() -> None:
    """Idempotent: one filter per harvest logger."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactDatabaseErrors) for f in logger.filters):
            logger.addFilter(RedactDatabaseErrors())
