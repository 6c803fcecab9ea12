"""How long an eager chain runs (docs/operations.md, "Eager activity execution"): at most
``eager_max_chain`` activities in a row while other work waits for the worker; past that only
while its ``-P threads`` pool is idle (a thread free, no delivered message waiting for one),
and never past ``EAGER_IDLE_FACTOR`` times ``eager_max_chain``. A prefork child or a solo
worker cannot see its pool, so its chains stop at ``eager_max_chain``."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state as worker_state

from harvest_celery import Harvest
from harvest_celery._runtime.celery import _pool_idle
from harvest_celery._runtime.runtime import EAGER_IDLE_FACTOR, Runtime


@pytest.fixture
def runtime(tmp_path: Any) -> Runtime:
    rt = Harvest(f"sqlite:///{tmp_path / 'h.db'}").runtime
    rt.local_queues = frozenset({"q"})  # as a worker sets it at init: eager execution is on
    return rt


def _chain(rt: Runtime, idle: Callable[[int], bool] | None, enabled: bool = True) -> int:
    """How many activities a scope takes when each completion offers one more; ``idle(n)``
    answers for the pool after ``n`` taken."""
    taken = [0]
    rt.pool_idle = None if idle is None else (lambda: idle(taken[0]))
    with rt.eager_scope(enabled) as take:
        while rt._accepting():
            rt._local.held = object()  # what send() holds back for this thread
            assert take() is not None
            taken[0] += 1
            assert taken[0] <= 1000, "the chain never stopped"
    return taken[0]


def test_a_busy_pool_stops_the_chain_at_eager_max_chain(runtime):
    assert _chain(runtime, lambda _n: False) == runtime.settings.eager_max_chain == 8


def test_an_unknown_pool_stops_the_chain_at_eager_max_chain(runtime):
    assert _chain(runtime, None) == 8  # prefork child, solo, outside a worker


def test_an_idle_pool_lets_the_chain_go_on_up_to_its_ceiling(runtime):
    assert _chain(runtime, lambda _n: True) == 8 * EAGER_IDLE_FACTOR == 32


def test_work_arriving_mid_chain_stops_it_at_once_past_the_cap(runtime):
    assert _chain(runtime, lambda n: n < 11) == 11  # idle until the 11th: stops there


def test_work_waiting_within_the_cap_does_not_cut_the_chain_short(runtime):
    # the fairness cap still holds: the first eager_max_chain run whatever the pool
    assert _chain(runtime, lambda n: n >= 100) == 8


def test_no_chain_when_eager_execution_is_off(runtime):
    assert _chain(runtime, lambda _n: True, enabled=False) == 0
    runtime.settings.eager_max_chain = 0  # off: an idle pool does not switch it on
    assert _chain(runtime, lambda _n: True) == 0


def test_the_scope_sends_what_it_still_holds_and_ends_the_chain(runtime):
    runtime.pool_idle = lambda: True
    with runtime.eager_scope(True):
        assert runtime._accepting()
    assert not runtime._accepting()  # outside a scope nothing is held back


# ── the pool's view (celery.worker.state) ──────────────────────────────────────────────────────
class _Request:  # reserved and active requests are kept in weak sets
    pass


def _worker(pool_module: str, concurrency: int) -> Any:
    return SimpleNamespace(pool_cls=type("Pool", (), {"__module__": pool_module}), concurrency=concurrency)


def test_a_threads_pool_is_idle_while_a_thread_is_free_and_nothing_waits():
    idle = _pool_idle(_worker("celery.concurrency.thread", 2))
    assert idle is not None
    held = [_Request(), _Request(), _Request()]
    try:
        worker_state.reserved_requests.add(held[0])
        worker_state.active_requests.add(held[0])  # the chain's own task: one of two threads
        assert idle()
        worker_state.reserved_requests.add(held[1])  # delivered, waiting for a thread
        assert not idle()
        worker_state.active_requests.add(held[1])  # now running: both threads busy
        assert not idle()
        worker_state.reserved_requests.discard(held[1])
        worker_state.active_requests.discard(held[1])
        assert idle()
    finally:
        for r in held:
            worker_state.reserved_requests.discard(r)
            worker_state.active_requests.discard(r)


@pytest.mark.parametrize(
    ("module", "concurrency"),
    [("celery.concurrency.prefork", 8), ("celery.concurrency.solo", 1), ("celery.concurrency.thread", 1)],
)
def test_pools_that_cannot_tell_keep_the_cap(module, concurrency):
    assert _pool_idle(_worker(module, concurrency)) is None
