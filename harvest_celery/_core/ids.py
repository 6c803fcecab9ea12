"""What may name a run. Pure.

An execution id is a non-empty string of at most 200 characters without ``:`` (task ids are
``<execution id>:<activity id>:<attempt>``, so a ``:`` would make one run's task ids look like
another's), ``/`` (unreachable through the HTTP API's paths) or a control character (invisible in
logs and pages, and NUL cannot be stored). Ids are checked where they are made — at start, and
for the new run of a reset or a retry — never when an existing run is looked up, so a run made
before the rule stays reachable.

Every id the engine makes from another (a child's default id, the next run of a continue-as-new
chain, the fork of a ``reset`` or a ``retry_dag_run``) comes from ``derived_id``, which always
returns a legal id, whatever the length or the characters of its source.
"""

from __future__ import annotations

import hashlib
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


DIGEST_LENGTH = 20  # hex characters of sha256: 80 bits, so distinct sources do not collide


def derived_id(source: str, suffix: str) -> str:
    """The id made from ``source`` by appending ``suffix`` (``"c3"``, ``"reset-1f2e3d4c"``):
    ``<source>-<suffix>`` when that is a legal id, else a deterministic id of at most
    ``MAX_ID_LENGTH`` characters hashed from both, which keeps a readable head of the source.

    ``suffix`` is the engine's own (letters, digits and ``-``); a source id may be anything an
    existing run is named (up to 200 characters, or an id made before the rules).
    """
    check_execution_id(suffix)
    plain = f"{source}-{suffix}"
    if _legal(plain):
        return plain
    digest = hashlib.sha256(f"{source}\x00{suffix}".encode("utf-8", "surrogatepass")).hexdigest()
    tail = f"h{digest[:DIGEST_LENGTH]}-{suffix}"
    room = MAX_ID_LENGTH - len(tail) - 1
    head = "".join(c for c in source if c not in FORBIDDEN and unicodedata.category(c) not in ("Cc", "Cs"))
    head = head[: max(room, 0)].strip()
    return check_execution_id(f"{head}-{tail}" if head else tail)


def child_id(parent_id: str, number: int) -> str:
    """A child's default id: ``<parent>-c<n>``, ``n`` its number in the parent (from 1)."""
    return derived_id(parent_id, f"c{number}")


def _legal(execution_id: str) -> bool:
    try:
        check_execution_id(execution_id)
    except InvalidExecutionId:
        return False
    return True
