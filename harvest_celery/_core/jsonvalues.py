"""JSON checks at the edges: every value that enters history must be plain JSON that Postgres can
store (no NaN, no NUL, no lone surrogate), nested at most ``MAX_JSON_DEPTH`` levels deep, and an
activity input may be capped in size. Pure.

The depth limit keeps every later recursive walk (``dataclasses.asdict`` of an event, the JSON
encoder, pydantic) far from Python's recursion limit: a value nested ~500 deep used to pass the
edge and then fail as a ``RecursionError`` deep inside a decision or an HTTP handler."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from harvest_celery._errors import PayloadNotSerializable, PayloadTooLarge

MAX_JSON_DEPTH = 100  # levels of nested arrays/objects; [] is 1, [[]] is 2


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
    except RecursionError:  # far deeper than MAX_JSON_DEPTH (or a cycle the encoder met)
        raise PayloadNotSerializable(what, _too_deep()) from None
    return text


def _too_deep() -> str:
    return f"it is nested more than {MAX_JSON_DEPTH} levels deep"


def nesting_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` holds arrays/objects nested more than ``limit`` deep. Iterative, level
    by level (no recursion, whatever the depth), and it visits containers only."""
    level, depth = ([value] if isinstance(value, (dict, list)) else []), 1
    while level:
        if depth > limit:
            return True
        below: list[Any] = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    below.append(child)
        level, depth = below, depth + 1
    return False


def check_depth(value: Any, what: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``value`` if it is nested at most ``limit`` deep; else ``PayloadNotSerializable``."""
    if isinstance(value, (dict, list)) and nesting_exceeds(value, limit):
        raise PayloadNotSerializable(what, _too_deep())
    return value


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` as it will read back from history (tuples become lists), or raise."""
    text = dumps(value, what)
    if "\\u0000" in text or "\\ud" in text:  # cheap gate before the full walk
        check_storable(value, what)
    try:
        loaded = json.loads(text)
    except RecursionError:
        raise PayloadNotSerializable(what, _too_deep()) from None
    # a text with at most MAX_JSON_DEPTH opening brackets cannot nest deeper: most payloads stop
    # at these two C-speed counts, and only a long, bracket-heavy one is walked (containers only)
    if len(text) > 2 * MAX_JSON_DEPTH and text.count("[") + text.count("{") > MAX_JSON_DEPTH:
        check_depth(loaded, what)
    return loaded


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
    """Every string in ``value`` (keys included) can be stored by Postgres, and it is nested at
    most ``MAX_JSON_DEPTH`` deep; else ``PayloadNotSerializable``, before anything is written."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not storable_text(item):
                raise PayloadNotSerializable(
                    what, "a string holds a NUL character or a lone surrogate, which cannot be stored"
                )
        elif isinstance(item, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise PayloadNotSerializable(what, _too_deep())
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return value


def check_cap(value: Any, what: str, cap: int | None, offloads: Callable[[Any], bool] | None = None) -> None:
    """Raise ``PayloadTooLarge`` if ``value`` is over ``cap`` bytes (``None`` = no cap), measured
    as plain compact JSON, unless ``offloads(value)``: a payload store takes it, and only its
    reference is stored inline (the spec's sizing note: a registered store lets an oversized
    compensation envelope through as a reference; forward inputs alike)."""
    if cap is None:
        return
    size = encoded_size(value, what)
    if size > cap and not (offloads is not None and offloads(value)):
        raise PayloadTooLarge(what, size, cap)
