"""The Celery app the benchmark workers run (``celery -A benchmarks.app worker -Q ...``).

One app carries every side of the comparison:

* harvest-celery, on the ``harvest_bench`` database:

  - ``bench_step`` (a no-op activity on queue ``bench``) and ``bench_seq(n)`` (a workflow of
    ``n`` sequential ``bench_step`` activities) — scenarios B1, B2, B3, and ``bench_loop`` (the
    same steps, continuing as new every ``per_link``) — B3's chain row; ``bench_seq`` is also
    the target of the schedule-lateness scenario's schedules;
  - ``bench_fanout`` (a DAG: ``fan_items`` → ``fan_cell`` mapped over its output, compensated by
    ``fan_undo`` → ``fan_fail``, which always fails, so the mapped node is unwound) — B4;
  - ``bench_wait`` (waits for the signal ``go``) — the memory scenario;
  - ``bench_seq16`` (``bench_seq`` over ``bench_step16``, ``concurrency=16``) and
    ``bench_rate_call`` (one call of ``bench_rated``, ``rate_limit="20/s"``) and
    ``bench_seq_keyed`` (``bench_seq`` over ``bench_step_keyed``, ``limit_key`` with a per-key
    ``concurrency=4``) — the limits scenario (docs/flow-control.md);
  - ``bench_adm`` (``bench_seq`` at most 16 admitted runs per key) and ``bench_hot`` (one step,
    at most 4 runs of one key) — the admission scenario (workflow admission);

* raw Celery: ``raw_step`` and ``raw_undo`` (the same no-op, queue ``bench``) — with
  ``canvas_step``/``canvas_sum``, the only tasks that store a result, in the Redis result backend
  (DB 7), so the client can wait on them;
* both: ``canvas_step`` and ``canvas_sum``, plain ``@app.task`` functions that harvest also
  adopts, so the same chord runs under plain Celery and under ``harvest.start_canvas`` — B5.

Harvest's own tasks ignore results (``configure_dedicated_celery_app`` sets ``task_ignore_result``), so the
result backend is used by the baseline only. ``bench_stats`` is a remote-control command the
harness calls to read a worker's counters and memory (``benchmarks.probes``).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.worker.control import inspect_command

from benchmarks import probes
from harvest_celery import DagBuilder, RetryPolicy, WorkflowContext, activity, dag, workflow
from harvest_celery._client import Harvest, configure_dedicated_celery_app

probes.install()

DATABASE_URL = os.environ.get(
    "HARVEST_BENCH_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_bench"
)
BROKER_URL = os.environ.get("HARVEST_BENCH_BROKER_URL", "redis://127.0.0.1:6379/7")
RESULT_BACKEND = os.environ.get("HARVEST_BENCH_RESULT_BACKEND", "redis://127.0.0.1:6379/7")

app = Celery("harvest_bench", broker=BROKER_URL, backend=RESULT_BACKEND)
configure_dedicated_celery_app(app)
app.conf.broker_transport_options = {"visibility_timeout": 3600}
app.conf.result_expires = 600

# the tracing scenario's "on" workers (benchmarks/scenarios/tracing.py): tracing on, every span
# kept by the SDK's in-memory exporter (counted by bench_stats)
TRACING = os.environ.get("HARVEST_BENCH_TRACING") == "1"
harvest = Harvest(DATABASE_URL, app, tracing=TRACING)
SPANS: Any = None
if TRACING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    SPANS = InMemorySpanExporter()
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(SPANS))
    harvest.tracing.provider = _provider
ONCE = RetryPolicy(max_attempts=1)


@activity(queue="bench")
def bench_step(x: int) -> int:
    return x + 1


@workflow
async def bench_seq(ctx: WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.execute_activity(bench_step, x)
    return x


@activity(queue="bench", concurrency=16)
def bench_step16(x: int) -> int:
    return x + 1


@workflow
async def bench_seq16(ctx: WorkflowContext, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.execute_activity(bench_step16, x)
    return x


@activity(queue="bench", concurrency=4, limit_key=lambda i: i["key"])
def bench_step_keyed(i: dict[str, Any]) -> dict[str, Any]:
    return {"x": i["x"] + 1, "key": i["key"]}


@workflow
async def bench_seq_keyed(ctx: WorkflowContext, data: dict[str, Any]) -> int:
    """``bench_seq`` over ``bench_step_keyed``: every step under a per-key ``concurrency=4``
    (the limits scenario spreads its runs over 4 keys: 16 slots in all, as ``bench_seq16``)."""
    i = {"x": 0, "key": data["key"]}
    for _ in range(data["n"]):
        i = await ctx.execute_activity(bench_step_keyed, i)
    return int(i["x"])


@activity(queue="bench", rate_limit="20/s")
def bench_rated(x: int) -> int:
    return x


@workflow
async def bench_rate_call(ctx: WorkflowContext, x: int) -> int:
    result: int = await ctx.execute_activity(bench_rated, x)
    return result


@workflow
async def bench_loop(ctx: WorkflowContext, data: dict[str, int]) -> int:
    """``bench_seq`` as a loop that continues as new every ``per_link`` steps (B3's chain row):
    counts to ``to`` with one ``bench_step`` per iteration."""
    x = data["x"]
    for _ in range(data["per_link"]):
        if x >= data["to"]:
            return x
        x = await ctx.execute_activity(bench_step, x)
    ctx.continue_as_new({**data, "x": x})


@workflow(concurrency=16, limit_key=lambda i: i["key"])
async def bench_adm(ctx: WorkflowContext, data: dict[str, Any]) -> int:
    """``bench_seq`` under workflow admission: at most 16 admitted runs per key (the admission
    scenario runs 64 in flight over 4 keys)."""
    x = 0
    for _ in range(data["n"]):
        x = await ctx.execute_activity(bench_step, x)
    return x


@workflow(concurrency=4, limit_key=lambda i: "hot")
async def bench_hot(ctx: WorkflowContext, _input: Any = None) -> int:
    """One step under a one-key limit of 4: every start and close of the admission scenario's
    hot phase locks the same limit row."""
    return await ctx.execute_activity(bench_step, 0)


@workflow
async def bench_wait(ctx: WorkflowContext, _input: Any = None) -> Any:
    return await ctx.wait_signal("go")


@activity(queue="bench", retry=ONCE)
def fan_items(task: dict[str, Any]) -> list[int]:
    return list(range(int(task["conf"]["cells"])))


@activity(queue="bench", retry=ONCE)
def fan_cell(x: int) -> int:
    return x + 1


@activity(queue="bench", retry=ONCE)
def fan_undo(envelope: dict[str, Any]) -> int:
    """The mapped node's compensator: DAG compensation is node-granular, so it receives every
    cell's output at once and undoes them one by one (here: a no-op per cell)."""
    undone = 0
    for _cell in envelope["output"]:
        undone += 1
    return undone


@activity(queue="bench", retry=ONCE)
def fan_fail(_task: dict[str, Any]) -> None:
    raise RuntimeError("bench: downstream node fails on purpose")


@dag
def bench_fanout(g: DagBuilder) -> None:
    items = g.activity(fan_items)
    cells = g.map_activity(fan_cell).over(items).compensate(fan_undo)
    g.activity(fan_fail).upstream(cells)


harvest.register(
    bench_step,
    bench_seq,
    bench_step16,
    bench_seq16,
    bench_step_keyed,
    bench_seq_keyed,
    bench_rated,
    bench_rate_call,
    bench_loop,
    bench_wait,
    fan_items,
    fan_cell,
    fan_undo,
    fan_fail,
    bench_fanout,
    bench_adm,
    bench_hot,
)


@app.task(name="raw_step", queue="bench", ignore_result=False)
def raw_step(x: int) -> int:
    """The baseline: the same no-op as ``bench_step``, as a plain Celery task."""
    return x + 1


@app.task(name="raw_undo", queue="bench", ignore_result=False)
def raw_undo(outputs: Any) -> int:
    """The baseline's undo: one cell (an int) or a batch of cells (a list)."""
    return len(outputs) if isinstance(outputs, list) else 1


@app.task(name="canvas_step", queue="bench", ignore_result=False)
def canvas_step(x: int) -> int:
    """B5's header task: an ordinary ``@app.task`` that a chord runs as is under plain Celery,
    and that harvest adopts for ``start_canvas`` (the same code, the same queue)."""
    return x + 1


@app.task(name="canvas_sum", queue="bench", ignore_result=False)
def canvas_sum(xs: list[int]) -> int:
    """B5's chord body."""
    return sum(xs)


for _name in ("canvas_step", "canvas_sum"):
    harvest.adopt_task(_name, queue="bench")


@inspect_command()
def bench_stats(state: Any) -> dict[str, Any]:
    """This worker's probe counters and memory, and how many warm runs it holds."""
    stats = probes.snapshot()
    stats["spans"] = len(SPANS.get_finished_spans()) if SPANS is not None else None
    sessions = getattr(harvest.runtime, "sessions", None)
    try:
        stats["warm_sessions"] = len(sessions) if sessions is not None else None
    except TypeError:
        stats["warm_sessions"] = None
    return stats
