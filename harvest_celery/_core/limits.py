"""Activity limits, as declared: concurrency, rate and key, checked once, at decoration. Pure.

``@activity(concurrency=N, rate_limit="20/s", limit_key=fn)`` and ``adopt_task(...)`` take
these options; ``ctx.execute_activity(priority=P)`` takes a priority. Every value is checked
here, before a definition exists or a command is recorded, so a bad one never reaches Postgres.
The semantics (global slots, GCRA, priority order) are in docs/flow-control.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from harvest_celery._errors import InvalidLimitKey

PRIORITY_MIN: Final = 0
PRIORITY_MAX: Final = 9
DEFAULT_PRIORITY: Final = 0
MAX_KEY_CHARS: Final = 200
_PERIODS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE: Final = re.compile(r"^([1-9][0-9]*)/([smh])$")


@dataclass(frozen=True)
class RateLimit:
    """Celery's format, global: ``count`` starts per ``period`` seconds, burst one."""

    count: int
    period: float
    text: str

    @property
    def interval(self) -> float:
        """GCRA's emission interval: the spacing between two starts, in seconds."""
        return self.period / self.count


@dataclass(frozen=True)
class Limits:
    """An activity's declared limits; ``limit_key`` makes both apply per key."""

    concurrency: int | None = None
    rate_limit: RateLimit | None = None
    limit_key: Callable[[Any], str] | None = None

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate_limit is not None


NO_LIMITS: Final = Limits()


def parse_rate_limit(text: object) -> RateLimit:
    """``"20/s"``, ``"5/m"``, ``"100/h"``: a positive integer over s, m or h; anything else is a
    ``ValueError`` naming the format."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"rate_limit must be a positive integer over /s, /m or /h, as in Celery ('20/s'), not {text!r}"
        )
    return RateLimit(int(match.group(1)), _PERIODS[match.group(2)], text)  # type: ignore[arg-type]


def check_concurrency(value: object, *, allow_zero: bool = False) -> int:
    """An int ≥ 1 (≥ 0 for an override, which holds every new slot at 0); never a bool."""
    floor = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < floor:
        raise ValueError(f"concurrency must be an int >= {floor}, not {value!r}")
    return value


def declare(concurrency: object = None, rate_limit: object = None, limit_key: object = None) -> Limits:
    """The decorator's options, checked: ``ValueError``/``TypeError`` for a bad one."""
    if limit_key is not None and not callable(limit_key):
        raise TypeError(f"limit_key must be callable (input → str), not {limit_key!r}")
    if limit_key is not None and concurrency is None and rate_limit is None:
        raise ValueError("limit_key without a limit: give concurrency= or rate_limit= too")
    return Limits(
        concurrency=None if concurrency is None else check_concurrency(concurrency),
        rate_limit=None if rate_limit is None else parse_rate_limit(rate_limit),
        limit_key=limit_key,  # type: ignore[arg-type]
    )


def check_priority(value: object) -> int:
    """An int from 0 to 9 (9 first); never a bool or a string."""
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"priority must be an int from {PRIORITY_MIN} to {PRIORITY_MAX}, not {value!r}")
    return value


def limit_key_of(name: str, limits: Limits, input: Any) -> str | None:
    """The key a new command of activity ``name`` is limited under (None: no key). A key function
    that raises, returns a non-string or more than 200 characters raises ``InvalidLimitKey``."""
    if limits.limit_key is None:
        return None
    try:
        key = limits.limit_key(input)
    except Exception as exc:  # noqa: BLE001 - any error of user code becomes the one error type
        raise InvalidLimitKey(name, f"limit_key raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(key, str):
        raise InvalidLimitKey(name, f"limit_key returned {type(key).__name__}, not str")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidLimitKey(name, f"limit_key returned {len(key)} characters, over {MAX_KEY_CHARS}")
    return key


def slot_text(hint: Mapping[str, Any]) -> str:
    """``waiting for a slot of charge_payment (3/3 in use)``; without a concurrency limit the
    rate limit holds it: ``(rate limited)``. Names no key (a key is payload)."""
    limit = hint.get("concurrency")
    of = f"{hint.get('in_use', 0)}/{limit} in use" if limit is not None else "rate limited"
    return f"waiting for a slot of {hint.get('activity')} ({of})"
