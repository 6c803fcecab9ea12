"""harvest's own log lines: the structured fields of a line about a run, and the JSON format.

Every line harvest logs about one run carries ``execution_id`` as a field of its record
(``extra``), and, where they apply, ``activity`` (the activity's name), ``activity_id`` and
``attempt``; a line about the whole process (the sweeper's pass, the lease heartbeat) carries
none. ``configure("json")`` (``Harvest(log_format="json")``, ``HARVEST_LOG_FORMAT=json``) gives
the ``harvest_celery`` and ``harvest_celery.api`` loggers a handler of their own that writes one
JSON object per line to standard error, and stops them from propagating, so a harvest line is
written once. Nothing else changes: the application's loggers, the root logger and its format
are left as they are, and the loggers' levels still come from the root. The redaction filter
(``_store.redaction``) sits on the loggers themselves, so it has run before any handler formats.
Standard library only.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

from harvest_celery._runtime.messages import DECIDE_TASK, Message, activity_ref
from harvest_celery._store.redaction import LOGGERS

FIELDS = ("execution_id", "activity", "activity_id", "attempt")  # a run line's structured fields
FORMATS = ("text", "json")


def run(
    execution_id: str, activity: str | None = None, activity_id: str | None = None, attempt: int | None = None
) -> dict[str, Any]:
    """The ``extra`` of a line about a run (the fields that apply; None ones are left out)."""
    given = {
        "execution_id": execution_id,
        "activity": activity,
        "activity_id": activity_id,
        "attempt": attempt,
    }
    return {k: v for k, v in given.items() if v is not None}


def of_claim(claim: Any) -> dict[str, Any]:
    """The ``extra`` of a line about a claimed attempt (a ``records.Claim``)."""
    return run(claim.execution_id, claim.activity_name, claim.activity_id, claim.attempt)


def of_message(message: Message) -> dict[str, Any]:
    """The ``extra`` of a line about a message harvest sends (its run, and its attempt if any)."""
    if message.task_name == DECIDE_TASK and message.args:
        return run(str(message.args[0]))
    ref = activity_ref(message.args, message.headers)
    if ref is None:
        return {}
    return run(ref[0], message.task_name, ref[1], ref[2])


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the run fields
    the record carries, and the exception (its traceback text) if one was logged."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class _JsonHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure("json")`` adds (one per harvest logger)."""


def configure(log_format: str) -> None:
    """Switch harvest's loggers to ``log_format`` (``"text"``: leave them as they are; ``"json"``:
    one JSON object per line, on standard error). Idempotent; ``ValueError`` for another format."""
    if log_format not in FORMATS:
        raise ValueError(f"log_format accepts {' or '.join(repr(f) for f in FORMATS)}, not {log_format!r}")
    if log_format != "json":
        return
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if any(isinstance(h, _JsonHandler) for h in logger.handlers):
            continue
        # the process's own standard error, even once Celery's worker has redirected sys.stderr
        # into a logger (a line written there would come back wrapped in Celery's format)
        handler = _JsonHandler(sys.__stderr__ or sys.stderr)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
        logger.propagate = False


__all__ = ["FIELDS", "FORMATS", "JsonFormatter", "configure", "of_claim", "of_message", "run"]
