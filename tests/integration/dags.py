"""DAGs and their activities for the integration tests. Every body records what it received (and
which queue/worker ran it) under the run's tag."""

from __future__ import annotations

import time
from typing import Any

from harvest_celery import CollectAll, DagBuilder, FailFast, RetryPolicy, activity, dag

from .app import record

NO_RETRY = RetryPolicy(max_attempts=1)


def tag_of(value: Any) -> str:
    """The run's tag, wherever it sits in an input or envelope."""
    if isinstance(value, dict):
        if isinstance(value.get("tag"), str):
            return value["tag"]
        for v in value.values():
            found = tag_of(v)
            if found:
                return found
    if isinstance(value, list):
        for v in value:
            found = tag_of(v)
            if found:
                return found
    return ""


def node(name: str, queue: str = "alpha", fail: bool = False, output: Any = None) -> Any:
    def body(value: Any) -> Any:
        tag = tag_of(value)
        record(tag, name, value)
        if fail or (isinstance(value, dict) and name in (value.get("conf") or {}).get("fail", [])):
            raise RuntimeError(f"{name} failed")
        if isinstance(value, dict) and (value.get("conf") or {}).get("slow") == name:
            time.sleep(2)
            raise RuntimeError(f"{name} failed slowly")
        return output if output is not None else {"tag": tag, "node": name}

    body.__name__ = name
    return activity(name=name, queue=queue, retry=NO_RETRY)(body)


@activity(queue="inventory", retry=NO_RETRY)
def undo_node(envelope: dict) -> str:
    """One generic compensator for many nodes: it branches on dag_compensate."""
    record(tag_of(envelope), f"undo:{envelope['dag_compensate']}", envelope)
    if envelope["dag_compensate"] in ((envelope.get("input") or {}).get("conf") or {}).get("undo_fails", []):
        raise RuntimeError(f"undo of {envelope['dag_compensate']} failed")
    return f"undone {envelope['dag_compensate']}"


@activity(queue="inventory", retry=NO_RETRY)
def undo_slowly(envelope: dict) -> str:
    record(tag_of(envelope), f"undo:{envelope['dag_compensate']}", envelope)
    time.sleep(3)
    return "ok"


# ── the diamond a → {b, c} → d ────────────────────────────────────────────────────────────────
dia_a = node("dia_a")
dia_b = node("dia_b", queue="beta")
dia_c = node("dia_c", queue="inventory")
dia_d = node("dia_d")


@dag
def diamond(g: DagBuilder) -> None:
    a = g.activity(dia_a).queue("alpha").compensate(undo_node)
    b = g.activity(dia_b).upstream(a).queue("beta").compensate(undo_node)
    c = g.activity(dia_c).upstream(a).compensate(undo_node)  # no queue: the compensator's default
    g.activity(dia_d).upstream(b, c).queue("alpha").compensate(undo_node)


# ── every envelope input shape ────────────────────────────────────────────────────────────────
sh_src = node("sh_src")
sh_other = node("sh_other")
sh_from = node("sh_from")
sh_all = node("sh_all")
sh_alias = node("sh_alias")
sh_cell = node("sh_cell")
sh_last = node("sh_last", fail=True)


@activity(name="sh_items", queue="alpha", retry=NO_RETRY)
def sh_items(value: dict) -> list:
    tag = tag_of(value)
    record(tag, "sh_items", value)
    return [{"tag": tag, "item": 1}, {"tag": tag, "item": 2}]


@dag
def shapes(g: DagBuilder) -> None:
    src = g.activity(sh_src).compensate(undo_node)
    other = g.activity(sh_other).compensate(undo_node)
    items = g.activity(sh_items)
    frm = g.activity(sh_from).input_from(src).compensate(undo_node)
    allb = g.activity(sh_all).input_from_all(src, other).compensate(undo_node)
    alias = g.activity(sh_alias).input_from_aliased(first=src, second=other).compensate(undo_node)
    cell = g.map_activity(sh_cell).over(items).compensate(undo_node)
    g.activity(sh_last).upstream(frm, allb, alias, cell)


# ── mapped nodes ──────────────────────────────────────────────────────────────────────────────
@activity(name="mp_produce", queue="alpha", retry=NO_RETRY)
def mp_produce(value: dict) -> list:
    tag = tag_of(value)
    record(tag, "mp_produce", value)
    return [{"tag": tag, "n": n} for n in value["conf"]["items"]]


@activity(name="mp_cell", queue="beta", retry=NO_RETRY)
def mp_cell(item: dict) -> int:
    record(item["tag"], "mp_cell", item)
    if item["n"] < 0:
        raise ValueError(f"negative {item['n']}")
    return int(item["n"]) * 10


mp_after = node("mp_after")
mp_fail = node("mp_fail", fail=True)


@dag
def map_collect(g: DagBuilder) -> None:
    produce = g.activity(mp_produce).compensate(undo_node)
    cells = g.map_activity(mp_cell, CollectAll).over(produce).compensate(undo_node)
    g.activity(mp_fail).upstream(cells)


@dag
def map_failfast(g: DagBuilder) -> None:
    produce = g.activity(mp_produce).compensate(undo_node)
    cells = g.map_activity(mp_cell, FailFast).over(produce).compensate(undo_node)
    g.activity(mp_after).upstream(cells).compensate(undo_node)


# ── cancel while a node runs ──────────────────────────────────────────────────────────────────
cx_first = node("cx_first")
cx_slow = node("cx_slow", queue="beta")


@dag
def cancellable(g: DagBuilder) -> None:
    first = g.activity(cx_first).compensate(undo_node)
    g.activity(cx_slow).upstream(first).compensate(undo_node)


# ── a payload cap that changes mid-unwind ─────────────────────────────────────────────────────
cap_big = node("cap_big")


@activity(name="cap_left", queue="alpha", retry=NO_RETRY)
def cap_left(value: dict) -> dict:
    record(tag_of(value), "cap_left", value)
    return {"tag": tag_of(value), "pad": "x" * 150}


@activity(name="cap_right", queue="alpha", retry=NO_RETRY)
def cap_right(value: dict) -> dict:
    record(tag_of(value), "cap_right", value)
    return {"tag": tag_of(value), "pad": "y" * 150}


@dag
def capped(g: DagBuilder) -> None:
    left = g.activity(cap_left).compensate(undo_slowly)
    right = g.activity(cap_right).compensate(undo_slowly)
    g.activity(cap_big).input_from_all(left, right)  # ~350 bytes: over a 300-byte cap


ACTIVITIES = [
    undo_node,
    undo_slowly,
    dia_a,
    dia_b,
    dia_c,
    dia_d,
    sh_src,
    sh_other,
    sh_items,
    sh_from,
    sh_all,
    sh_alias,
    sh_cell,
    sh_last,
    mp_produce,
    mp_cell,
    mp_after,
    mp_fail,
    cx_first,
    cx_slow,
    cap_left,
    cap_right,
    cap_big,
]
DAGS = [diamond, shapes, map_collect, map_failfast, cancellable, capped]


# ── retry-from-node ───────────────────────────────────────────────────────────────────────────
rt_a = node("rt_a")
rt_c = node("rt_c", queue="beta")


@activity(name="rt_b", queue="alpha", retry=NO_RETRY)
def rt_b(value: Any) -> dict:
    """Fails on its first run for a tag, succeeds afterwards."""
    from .app import r

    tag = tag_of(value)
    record(tag, "rt_b", value)
    if r.incr(f"rt_b:{tag}") == 1:
        raise RuntimeError("rt_b failed the first time")
    return {"tag": tag, "node": "rt_b", "saw": value}


@dag
def retryable(g: DagBuilder) -> None:
    a = g.activity(rt_a)
    b = g.activity(rt_b).input_from(a)
    g.activity(rt_c).input_from(b)


@activity(name="big_out", queue="alpha", retry=NO_RETRY)
def big_out(value: dict) -> dict:
    record(tag_of(value), "big_out", None)
    return {"tag": tag_of(value), "pad": "b" * (2 * 1024 * 1024 + 10)}


bo_fail = node("bo_fail", fail=True)


@dag
def oversized_envelope(g: DagBuilder) -> None:
    """big_out's compensation envelope is over the default 2 MiB cap: rejected pre-dispatch,
    so the unwind records its marker but dispatches nothing."""
    big = g.activity(big_out).compensate(undo_node)
    g.activity(bo_fail).upstream(big)


ds_first = node("ds_first")
ds_slow = node("ds_slow", queue="beta")


@dag
def drained(g: DagBuilder) -> None:
    first = g.activity(ds_first).compensate(undo_node)
    g.activity(ds_slow).upstream(first)


# ── an over-cap envelope and a payload store ─────────────────────────────────────────────────
@activity(name="ob_big", queue="alpha", retry=NO_RETRY)
def ob_big(value: dict) -> dict:
    """Outputs ``conf["pad"]`` bytes of padding, so its compensation envelope is that large."""
    conf = value["conf"]
    record(conf["tag"], "ob_big", len(conf.get("blob", "")))
    return {"tag": conf["tag"], "pad": "o" * int(conf["pad"])}


ob_fail = node("ob_fail", fail=True)


@dag
def offloaded_envelope(g: DagBuilder) -> None:
    big = g.activity(ob_big).compensate(undo_node)
    g.activity(ob_fail).upstream(big)


ACTIVITIES += [rt_a, rt_b, rt_c, big_out, bo_fail, ds_first, ds_slow, ob_big, ob_fail]
DAGS += [retryable, oversized_envelope, drained, offloaded_envelope]
