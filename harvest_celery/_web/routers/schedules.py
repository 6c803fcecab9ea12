"""Schedules over HTTP (docs/schedules.md): list, describe, create, pause with a note, resume,
trigger now, delete. The same token auth as every mutating endpoint; the request and response
models are declared here, beside the only router that uses them."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import Enum
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from harvest_celery._core.jsonvalues import check_storable
from harvest_celery._core.schedule import seconds_of
from harvest_celery._web.deps import Guard, HarvestDep
from harvest_celery._web.errors import error_responses

NamePath = Annotated[str, Path(description="the schedule name")]
Overlap = Literal["skip", "buffer_one", "allow_all"]


class ScheduleView(BaseModel):
    name: str
    workflow: str = Field(description="the workflow, or for a task schedule (import-beat) the adopted task")
    target: Literal["workflow", "task"] = "workflow"
    queue: str | None = Field(None, description="a task schedule's queue (none: the adopted task's own)")
    cron: str | None = None
    every_seconds: int | None = None
    timezone: str
    overlap: str
    catchup_seconds: float
    jitter_seconds: float
    end_at: str | None = None
    max_runs: int | None = None
    paused: bool
    pause_note: str | None = None
    spec_version: int
    last_tick: str | None = None
    next_fire_at: str | None = None
    ended: bool
    buffered_tick: str | None = None
    last_run_id: str | None = None
    last_run_status: str | None = None
    failing: bool
    runs: int
    fired: int
    skipped: int
    missed: int


class ScheduleList(BaseModel):
    schedules: list[ScheduleView]


class CreateSchedule(BaseModel):
    name: str
    workflow: str
    cron: str | None = None
    every_seconds: float | None = Field(
        default=None, description="instead of cron: whole seconds, at least 1"
    )
    timezone: str | None = None
    input: Any = None
    overlap: Overlap = "skip"
    catchup_seconds: float = 0.0
    jitter_seconds: float | None = None
    end_at: datetime | None = None
    max_runs: int | None = None


class PauseSchedule(BaseModel):
    note: str = ""


class TriggerSchedule(BaseModel):
    overlap: Overlap | None = None


class Triggered(BaseModel):
    name: str
    run_id: str | None = Field(description="None: the overlap policy skipped it")


def _duration(seconds: float | None, what: str) -> timedelta | None:
    """Seconds from a request as a ``timedelta``; one no ``timedelta`` holds (or past the
    columns) is ``InvalidSchedule`` (400), as the client's own check would say."""
    return None if seconds is None else timedelta(seconds=seconds_of(seconds, what))


def list_schedules(harvest: HarvestDep, failing: bool = False) -> dict[str, Any]:
    """Every schedule (``failing``: only those whose last tick's run failed)."""
    return {"schedules": [s for s in harvest.list_schedules() if s["failing"] or not failing]}


def describe_schedule(harvest: HarvestDep, name: NamePath) -> dict[str, Any]:
    return harvest.describe_schedule(name)


def create_schedule(harvest: HarvestDep, body: CreateSchedule) -> dict[str, Any]:
    """Create a schedule in the app's decision queue (400 a bad argument, 404 an unknown
    workflow, 409 a taken name; nothing written)."""
    check_storable(body.input, f"input of schedule {body.name!r}")
    harvest.create_schedule(
        body.name,
        workflow=body.workflow,
        cron=body.cron,
        every=_duration(body.every_seconds, "every_seconds"),
        timezone=body.timezone,
        input=body.input,
        overlap=body.overlap,
        catchup_window=timedelta(seconds=seconds_of(body.catchup_seconds, "catchup_seconds")),
        jitter=_duration(body.jitter_seconds, "jitter_seconds"),
        end_at=body.end_at,
        max_runs=body.max_runs,
    )
    return harvest.describe_schedule(body.name)


def pause_schedule(harvest: HarvestDep, name: NamePath, body: PauseSchedule | None = None) -> dict[str, Any]:
    note = body.note if body is not None else ""
    check_storable(note, "the pause note")
    harvest.pause_schedule(name, note)
    return harvest.describe_schedule(name)


def resume_schedule(harvest: HarvestDep, name: NamePath) -> dict[str, Any]:
    harvest.resume_schedule(name)
    return harvest.describe_schedule(name)


def trigger_schedule(
    harvest: HarvestDep, name: NamePath, body: TriggerSchedule | None = None
) -> dict[str, Any]:
    """Start a run now, ``<name>@manual-<8 hex>``, under the overlap policy or ``overlap``."""
    return {"name": name, "run_id": harvest.trigger_schedule(name, overlap=body.overlap if body else None)}


def delete_schedule(harvest: HarvestDep, name: NamePath) -> dict[str, Any]:
    """Delete a schedule with its stored input (runs keep their own copies)."""
    harvest.delete_schedule(name)
    return {"name": name, "deleted": True}


def router(guard: Guard) -> APIRouter:
    r = APIRouter()
    tags: list[str | Enum] = ["schedules"]
    r.add_api_route(
        "/schedules",
        list_schedules,
        methods=["GET"],
        response_model=ScheduleList,
        responses=error_responses(422),
        tags=tags,
    )
    r.add_api_route(
        "/schedules/{name}",
        describe_schedule,
        methods=["GET"],
        response_model=ScheduleView,
        responses=error_responses(400, 404, 422),
        tags=tags,
    )
    mutating: list[tuple[str, Any, list[str], Any, int]] = [
        ("/schedules", create_schedule, ["POST"], ScheduleView, 201),
        ("/schedules/{name}/pause", pause_schedule, ["POST"], ScheduleView, 200),
        ("/schedules/{name}/resume", resume_schedule, ["POST"], ScheduleView, 200),
        ("/schedules/{name}/trigger", trigger_schedule, ["POST"], Triggered, 200),
        ("/schedules/{name}", delete_schedule, ["DELETE"], None, 200),
    ]
    for path, endpoint, methods, model, status in mutating:
        r.add_api_route(
            path,
            endpoint,
            methods=methods,
            status_code=status,
            response_model=model,
            dependencies=guard.dependencies,
            responses=guard.responses(),
            tags=tags,
        )
    return r
