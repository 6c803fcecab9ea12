"""``harvest_decision_replays_total{replay}`` (docs/operations.md#metrics): every decision counts
once, ``warm`` when advanced from this process's session, ``cold`` when the whole history was
replayed — in embedded mode (SQLite, one process), so no service is needed."""

from __future__ import annotations

from pathlib import Path

from harvest_celery import Harvest, WorkflowContext, activity, workflow
from harvest_celery._runtime.metrics import METRICS


@activity
def hop(x: int) -> int:
    return x + 1


@workflow
async def hops(ctx: WorkflowContext, n: int) -> int:
    value = 0
    for _ in range(n):
        value = await ctx.execute_activity(hop, value)
    return value


def _counts() -> tuple[float, float]:
    return (
        METRICS.value("decision_replays", {"replay": "warm"}),
        METRICS.value("decision_replays", {"replay": "cold"}),
    )


def _run(tmp_path: Path, name: str, **keywords: bool) -> tuple[float, float]:
    h = Harvest(f"sqlite:///{tmp_path / name}.db", **keywords)
    h.register(hop, hops)
    h.migrate()
    before = _counts()
    run_id = h.start_workflow("hops", 4)
    assert h.result(run_id, timeout=30) == 4
    after = _counts()
    h.store.dispose()
    return after[0] - before[0], after[1] - before[1]


def test_warm_sessions_are_counted_warm_and_the_first_replay_cold(tmp_path: Path) -> None:
    warm, cold = _run(tmp_path, "warm")
    assert cold >= 1  # the first decision has no session yet
    assert warm >= 3  # one per completed hop at least


def test_without_sticky_sessions_every_replay_is_cold(tmp_path: Path) -> None:
    warm, cold = _run(tmp_path, "cold", sticky_sessions=False)
    assert warm == 0
    assert cold >= 5  # the start and each of the four completions
