"""Workflow admission, as declared: ``@workflow(concurrency=N, limit_key=fn)`` and a start's
``priority``, checked before anything is written. Pure.

At most N runs of a workflow (per key, with ``limit_key``) are *admitted* at once; the others
wait, durably, in start order (docs/flow-control.md, "Workflow admission"). The limit reuses the
activity limits' rules: the concurrency check, the priority range and the key rules
(``_core.limits``), and the limits table (``_store.admission``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from harvest_celery._core.limits import DEFAULT_PRIORITY, MAX_KEY_CHARS, check_concurrency, check_priority
from harvest_celery._errors import InvalidLimitKey

__all__ = ["NO_ADMISSION", "Admission", "admission_text", "check_priority", "declare_admission", "key_of"]


@dataclass(frozen=True)
class Admission:
    """A workflow's declared admission limit; ``concurrency`` None: unlimited (admitted at start)."""

    concurrency: int | None = None
    limit_key: Callable[[Any], str] | None = None

    @property
    def limited(self) -> bool:
        return self.concurrency is not None


NO_ADMISSION: Final = Admission()


def declare_admission(concurrency: object = None, limit_key: object = None) -> Admission:
    """``@workflow``'s options, checked: ``ValueError``/``TypeError`` for a bad one."""
    if limit_key is not None and not callable(limit_key):
        raise TypeError(f"limit_key must be callable (input → str), not {limit_key!r}")
    if limit_key is not None and concurrency is None:
        raise ValueError("limit_key without a limit: give concurrency= too")
    if concurrency is None:
        return NO_ADMISSION
    return Admission(check_concurrency(concurrency), limit_key)  # type: ignore[arg-type]


def key_of(name: str, admission: Admission, input: Any) -> str | None:
    """The key a new run of ``name`` is admitted under (None: no ``limit_key``, one global limit
    or none). A key function that raises, returns a non-string or more than 200
    characters raises ``InvalidLimitKey`` (the activity limits' rule)."""
    if admission.limit_key is None:
        return None
    try:
        key = admission.limit_key(input)
    except Exception as exc:  # noqa: BLE001 - any error of user code becomes the one error type
        raise InvalidLimitKey(name, f"limit_key raised {type(exc).__name__}: {exc}", "workflow") from exc
    if not isinstance(key, str):
        raise InvalidLimitKey(name, f"limit_key returned {type(key).__name__}, not str", "workflow")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidLimitKey(
            name, f"limit_key returned {len(key)} characters, over {MAX_KEY_CHARS}", "workflow"
        )
    return key


def start_priority(value: object = DEFAULT_PRIORITY) -> int:
    """A start's priority: an int from 0 to 9, 9 first (``ValueError`` otherwise)."""
    return check_priority(value)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st…"""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def admission_text(hint: Mapping[str, Any]) -> str:
    """``waiting for admission to checkout: 3rd of 7 waiting; 1/1 in use``. Names no key."""
    limit = hint.get("concurrency")
    of = f"{hint.get('in_use', 0)}/{limit} in use" if limit is not None else "no limit in force"
    position = hint.get("position")
    place = f"{ordinal(position)} of {hint.get('waiting', 0)} waiting" if position else "waiting"
    return f"waiting for admission to {hint.get('workflow')}: {place}; {of}"


def holder_state(holder: Mapping[str, Any]) -> str:
    """Why a slot holder is not moving, in a word or two: ``paused``, ``nd-blocked: <reason>``,
    ``cancelling``, ``decision pending`` or ``running`` (it waits on its own work)."""
    if holder.get("paused_at") is not None:
        return "paused"
    if holder.get("nd_blocked_at") is not None:
        return f"nd-blocked: {holder.get('nd_block_reason') or 'non-deterministic'}"
    if holder.get("cancel_requested_at") is not None:
        return "cancelling"
    if holder.get("decision_requested_at") is not None:
        return "decision pending"
    return "running"


def admission_hint(
    place: Mapping[str, Any], holders: Sequence[Mapping[str, Any]], waited: float
) -> dict[str, Any]:
    """``stuck()``'s hint for a run waiting for admission (``kind: "admission"``), from Postgres
    alone: its place, and each slot holder with why it is not moving ("slot held by run X:
    paused")."""
    held = [{"execution_id": h["id"], "state": holder_state(h)} for h in holders]
    said = "; ".join(f"slot held by run {h['execution_id']}: {h['state']}" for h in held)
    return {
        "kind": "admission",
        "workflow": place.get("workflow"),
        "queue": "",
        "waiting_seconds": waited,
        "position": place.get("position"),
        "waiting_runs": place.get("waiting"),
        "in_use": place.get("in_use"),
        "concurrency": place.get("concurrency"),
        "holders": held,
        "text": admission_text(place) + (f" ({said})" if said else ""),
    }
