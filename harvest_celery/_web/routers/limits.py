"""Activity limits over HTTP (docs/flow-control.md): list the limits in force with their use,
set a run-time override of concurrency and/or rate limit, clear it back to the declared values.
The same token auth as every mutating endpoint; the models are declared here, beside the only
router that uses them."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field, StrictInt, StrictStr, model_validator

from harvest_celery._web.deps import Guard, HarvestDep, check_name
from harvest_celery._web.errors import error_responses

LimitPath = Annotated[str, Path(description="the limited activity (or adopted task) name")]
MAX_OVERRIDE = 2**31 - 1  # the override column is 32-bit


class LimitView(BaseModel):
    name: str
    declared_concurrency: int | None = Field(description="the decorator's value (None: a rate limit only)")
    override_concurrency: int | None = Field(description="the run-time override in force, if any")
    declared_rate_limit: str | None = Field(None, description="the decorator's rate (None: none)")
    override_rate_limit: str | None = Field(None, description="the run-time rate override, if any")
    override_set_at: datetime | None = None
    in_use: int = Field(description="slots held now, summed over keys")
    waiting: int = Field(description="dispatches waiting for a slot")
    keys: int = Field(description="how many limit keys hold a row (keys themselves are payload)")


class LimitList(BaseModel):
    limits: list[LimitView]


class SetLimit(BaseModel):
    concurrency: StrictInt | None = Field(
        None, ge=0, le=MAX_OVERRIDE, description="0 holds every new slot; an int, never a bool"
    )
    rate_limit: StrictStr | None = Field(
        None, max_length=40, description="Celery's format: a positive integer over /s, /m or /h ('20/s')"
    )

    @model_validator(mode="after")
    def _one_at_least(self) -> SetLimit:
        if self.concurrency is None and self.rate_limit is None:
            raise ValueError("give concurrency and/or rate_limit")
        return self


def _view(harvest: HarvestDep, name: str) -> dict[str, Any]:
    return next(entry for entry in harvest.limits() if entry["name"] == name)


def list_limits(harvest: HarvestDep) -> dict[str, Any]:
    """Every limited activity with its declared value, override, slots in use and waiting."""
    return {"limits": harvest.limits()}


def set_limit(harvest: HarvestDep, name: LimitPath, body: SetLimit) -> dict[str, Any]:
    """Override a limit's concurrency and/or rate (404 a name with no limit, 400 a bad rate;
    nothing written). Lowering it stops no running body: only new slots and tokens follow it."""
    check_name(name, "a limit name")
    harvest.set_limit(name, body.concurrency, rate_limit=body.rate_limit)
    return _view(harvest, name)


def clear_limit(harvest: HarvestDep, name: LimitPath) -> dict[str, Any]:
    """Clear the override: back to the declared values (404 a name with no limit)."""
    check_name(name, "a limit name")
    harvest.set_limit(name, clear=True)
    return _view(harvest, name)


def router(guard: Guard) -> APIRouter:
    r = APIRouter()
    tags: list[str | Enum] = ["limits"]
    r.add_api_route(
        "/limits",
        list_limits,
        methods=["GET"],
        response_model=LimitList,
        responses=error_responses(422),
        tags=tags,
    )
    for method, endpoint in (("PUT", set_limit), ("DELETE", clear_limit)):
        r.add_api_route(
            "/limits/{name}",
            endpoint,
            methods=[method],
            response_model=LimitView,
            dependencies=guard.dependencies,
            responses=guard.responses(),
            tags=tags,
        )
    return r
