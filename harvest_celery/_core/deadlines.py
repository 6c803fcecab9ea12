"""Deadlines of a run (docs/concepts.md, "Deadlines"): ``execution_timeout`` spans a
continue-as-new chain, ``run_timeout`` applies to each run. Checked before anything is written;
stored as the run row's ``execution_deadline_at`` and ``run_deadline_at``. A deadline is never a
timer: the sweeper finds it due and appends ``WorkflowTimeoutRequested``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

# a deadline further out than this is refused: it would never be due, and past it a datetime
# overflows
MAX_TIMEOUT = timedelta(days=365 * 100)


def check_timeout(name: str, value: Any) -> timedelta | None:
    """``value`` (a ``timedelta``, or seconds as a number; None: no deadline) as a timedelta;
    ``ValueError`` for one that is not positive, not finite, too long, or of another type."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        span = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or abs(value) > MAX_TIMEOUT.total_seconds():
            raise ValueError(
                f"{name} must be a positive number of seconds of at most 100 years, not {value!r}"
            )
        span = timedelta(seconds=value)
    else:
        raise ValueError(f"{name} is a timedelta or a number of seconds, not {type(value).__name__}")
    if span <= timedelta(0):
        raise ValueError(f"{name} must be positive, not {value!r}")
    if span > MAX_TIMEOUT:
        raise ValueError(f"{name} must be at most 100 years, not {value!r}")
    return span


@dataclass(frozen=True)
class Timeouts:
    """A start's checked timeouts (None: no deadline)."""

    execution: timedelta | None = None
    run: timedelta | None = None

    @classmethod
    def checked(cls, execution_timeout: Any = None, run_timeout: Any = None) -> Timeouts:
        return cls(
            check_timeout("execution_timeout", execution_timeout), check_timeout("run_timeout", run_timeout)
        )

    def __bool__(self) -> bool:
        return self.execution is not None or self.run is not None

    def deadlines(self, now: datetime) -> dict[str, datetime | None]:
        """The run row's deadline columns of a start at ``now``."""
        return {
            "execution_deadline_at": now + self.execution if self.execution is not None else None,
            "run_deadline_at": now + self.run if self.run is not None else None,
        }
