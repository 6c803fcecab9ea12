"""Retry policy for activities: how many attempts, how long between them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RetryPolicy:
    """Retry budget of an activity.

    ``max_attempts`` counts the first attempt (1 = never retry). The delay before attempt
    ``n + 1`` is ``initial_interval * backoff_coefficient ** (n - 1)``, capped at
    ``maximum_interval``. An error whose class name is in ``non_retryable_error_types`` fails the
    activity at once. Backoff is held in Postgres and fired by the sweeper, never by Celery ETAs.
    """

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    maximum_interval: float = 60.0
    non_retryable_error_types: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be at least 1")
        if self.initial_interval < 0 or self.maximum_interval < 0:
            raise ValueError("RetryPolicy intervals must not be negative")
        if self.backoff_coefficient < 1:
            raise ValueError("RetryPolicy.backoff_coefficient must be at least 1")
        object.__setattr__(self, "non_retryable_error_types", tuple(self.non_retryable_error_types))

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one."""
        exponent = min(max(attempt - 1, 0), 64)  # past 2**64 every interval is capped anyway
        try:
            delay = self.initial_interval * (self.backoff_coefficient**exponent)
        except OverflowError:
            return self.maximum_interval
        return min(delay, self.maximum_interval)

    def should_retry(self, attempt: int, error_type: str) -> bool:
        return attempt < self.max_attempts and error_type not in self.non_retryable_error_types

    def to_data(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "initial_interval": self.initial_interval,
            "backoff_coefficient": self.backoff_coefficient,
            "maximum_interval": self.maximum_interval,
            "non_retryable_error_types": list(self.non_retryable_error_types),
        }

    @classmethod
    def from_data(cls, data: dict[str, Any] | None) -> RetryPolicy:
        if not data:
            return cls()
        return cls(**{**data, "non_retryable_error_types": tuple(data.get("non_retryable_error_types", ()))})


DEFAULT_RETRY = RetryPolicy()
