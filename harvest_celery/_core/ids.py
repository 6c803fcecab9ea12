"""What may name a run. Pure.

An execution id is a non-empty string of at most 200 characters without ``:`` (task ids are
``<execution id>:<activity id>:<attempt>``, so a ``:`` would make one run's task ids look like
another's), ``/`` (unreachable through the HTTP API's paths) or a control character (invisible in
logs and pages, and NUL cannot be stored). Ids are checked where they are made — at start, and
for the new run of a reset or a retry — never when an existing run is looked up, so a run made
before the rule stays reachable.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from harvest_celery._errors import InvalidExecutionId

MAX_ID_LENGTH = 200
FORBIDDEN = {":": "a ':'", "/": "a '/'"}


def check_execution_id(execution_id: Any) -> str:
    """Return ``execution_id`` if it may name a new run; else ``InvalidExecutionId``."""
    if not isinstance(execution_id, str):
        raise InvalidExecutionId(execution_id, f"an id is a string, not {type(execution_id).__name__}")
    if not execution_id.strip():
        raise InvalidExecutionId(execution_id, "an id may not be empty or only spaces")
    if len(execution_id) > MAX_ID_LENGTH:
        raise InvalidExecutionId(
            execution_id[:40] + "...",
            f"an id has at most {MAX_ID_LENGTH} characters, not {len(execution_id)}",
        )
    for char in execution_id:
        if char in FORBIDDEN:
            raise InvalidExecutionId(execution_id, f"an id may not hold {FORBIDDEN[char]}")
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise InvalidExecutionId(
                execution_id, f"an id may not hold a control character (U+{ord(char):04X})"
            )
    return execution_id
