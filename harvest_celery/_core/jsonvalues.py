"""JSON checks at the edges: every value that enters history must be plain JSON that Postgres can
store (no NaN, no NUL, no lone surrogate), and an activity input may be capped in size. Pure."""

from __future__ import annotations

import json
import math
from typing import Any

from harvest_celery._errors import PayloadNotSerializable, PayloadTooLarge


def _reject_nan(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{value!r} is not valid JSON")
    return value


def encoded_size(value: Any, what: str) -> int:
    """Bytes of ``value`` as compact JSON; raises ``PayloadNotSerializable`` naming ``what``."""
    return len(dumps(value, what).encode("utf-8"))


def dumps(value: Any, what: str) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, sort_keys=False)
    except (TypeError, ValueError) as exc:
        raise PayloadNotSerializable(what, str(exc)) from None
    return text


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` as it will read back from history (tuples become lists), or raise."""
    text = dumps(value, what)
    if "\\u0000" in text or "\\ud" in text:  # cheap gate before the full walk
        check_storable(value, what)
    return json.loads(text)


def storable_text(text: str) -> bool:
    # Postgres text and jsonb cannot hold NUL, and a lone surrogate cannot be encoded as UTF-8.
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_storable(value: Any, what: str) -> Any:
    """Every string in ``value`` (keys included) can be stored by Postgres; else
    ``PayloadNotSerializable``, before anything is written."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not storable_text(item):
                raise PayloadNotSerializable(what, "a string holds a NUL character or a lone "
                                                   "surrogate, which cannot be stored")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def check_cap(value: Any, what: str, cap: int | None) -> None:
    """Raise ``PayloadTooLarge`` if ``value`` is over ``cap`` bytes (``None`` = no cap)."""
    if cap is None:
        return
    size = encoded_size(value, what)
    if size > cap:
        raise PayloadTooLarge(what, size, cap)
