"""Payload checks at the edges: every value that enters history must be plain JSON."""

from __future__ import annotations

import json
import math
from typing import Any

from ._errors import PayloadNotSerializable, PayloadTooLarge


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
    return json.loads(dumps(value, what))


def check_cap(value: Any, what: str, cap: int | None) -> None:
    """Raise ``PayloadTooLarge`` if ``value`` is over ``cap`` bytes (``None`` = no cap)."""
    if cap is None:
        return
    size = encoded_size(value, what)
    if size > cap:
        raise PayloadTooLarge(what, size, cap)
