"""What the in-process completion-path tests read (``test_admission_close``, ``test_limits_trip``,
``test_cold_completion``): the decisions and fallbacks counted, by path and reason, and run ids."""

from __future__ import annotations

import uuid

from harvest_celery._runtime.completion import FALLBACK_REASONS
from harvest_celery._runtime.metrics import METRICS


def run_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def fallbacks() -> dict[str, float]:
    """Every fallback reason's count so far (``harvest_decision_fallbacks_total``)."""
    return {r: METRICS.value("decision_fallbacks", {"reason": r}) for r in FALLBACK_REASONS}


def counted(before: dict[str, float]) -> dict[str, float]:
    """The fallbacks counted since ``before`` (``fallbacks()``), by reason; none: ``{}``."""
    return {r: v - before[r] for r, v in fallbacks().items() if v != before[r]}


def decisions(path: str, workflow: str) -> float:
    return METRICS.value("decisions", {"workflow": workflow, "path": path})
