"""What every router of the operator API shares: the ``Harvest`` dependency (the app's own, from
``app.state``), the ``Guard`` of mutating endpoints, the execution-id path parameter, and the
id/name checks at the edge.

Inputs are validated here before anything touches the database, so a rejected request writes
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Path, Request

from harvest_celery._client import Harvest
from harvest_celery._core.jsonvalues import storable_text as _storable_text
from harvest_celery._web.errors import error_responses

MAX_ID_LENGTH = 200
MAX_NAME_LENGTH = 200


def get_harvest(request: Request) -> Harvest:
    """The ``Harvest`` the app was created over (``create_app`` stores it in ``app.state``)."""
    harvest: Harvest = request.app.state.harvest
    return harvest


HarvestDep = Annotated[Harvest, Depends(get_harvest)]
ExecutionIdPath = Annotated[str, Path(description="the execution id")]


@dataclass(frozen=True)
class Guard:
    """How an app guards its mutating endpoints: the auth dependencies (none without a token) and
    the error statuses those endpoints publish (401 only with a token)."""

    dependencies: list[Any]
    errors: tuple[int, ...]

    def responses(self, *extra: int) -> dict[int | str, dict[str, Any]]:
        return error_responses(*self.errors, *extra)


# ── validation at the edge ───────────────────────────────────────────────────────────────────
def check_id(value: str, what: str = "an execution id") -> str:
    """Non-empty, at most 200 characters, storable; ``ValueError`` (→ 400) otherwise."""
    if not value.strip() or len(value) > MAX_ID_LENGTH or not _storable_text(value):
        raise ValueError(
            f"{what} is a non-empty string of at most {MAX_ID_LENGTH} characters with no NUL character"
        )
    return value


def check_name(value: str, what: str) -> str:
    if not value.strip() or len(value) > MAX_NAME_LENGTH or not _storable_text(value):
        raise ValueError(
            f"{what} is a non-empty string of at most {MAX_NAME_LENGTH} characters with no NUL character"
        )
    return value
