"""Turn a results JSON into tables (plain text for the terminal, Markdown for docs) and plots.

    python -m benchmarks.report [benchmarks/results/latest.json] [--markdown] [--plots-dir DIR]

Every ratio is harvest's cost over the baseline's — time per unit of work, so for throughput it
is baseline steps/s ÷ harvest steps/s: > 1 means harvest is slower.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS

Row = list[str]


def fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def x(v: Any) -> str:
    return "n/a" if fmt(v) == "n/a" else f"{fmt(v)}×"


def xs(s: Any) -> str:
    """A median ratio with its min–max spread, e.g. ``1.02× (0.97–1.08, n=5)``."""
    if not isinstance(s, dict) or not s.get("n"):
        return "n/a"
    return f"{x(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])}, n={s['n']})"


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def main_rows(res: dict[str, Any]) -> list[Row]:
    """Scenario | metric | harvest | raw Celery | DBOS | harvest÷raw | harvest÷DBOS."""
    rows: list[Row] = []
    seq = res.get("sequential", {})
    dbos_step = _get(seq, "dbos", "per_step", "median_ms")
    if "error" in seq:
        rows.append(["B1", "sequential", "error: " + seq["error"][:80], "", "", "", ""])
    for key, tag in (("single", "B1a"), ("split", "B1b")):
        t = _get(seq, "topologies", key)
        if not t:
            continue
        if "error" in t:
            rows.append([tag, f"sequential ({key})", "error", "", "", "", ""])
            continue
        raw = t["raw_celery"]["client_waited"]["per_step"]["median_ms"]
        h, span = t["harvest"]["per_step"]["median_ms"], t["harvest"]["server_span_per_step"]["median_ms"]
        rows.append(
            [
                tag,
                f"sequential, {t['label']}: ms/step, client start→result",
                fmt(h),
                fmt(raw),
                fmt(dbos_step),
                x(t["ratios"]["harvest_over_raw_celery"]),
                x(t["ratios"]["harvest_over_dbos"]),
            ]
        )
        rows.append(
            [
                tag,
                "  same runs, median of per-round ratios (min–max)",
                "",
                "",
                "",
                xs(t["ratios"].get("rounds_harvest_over_raw_celery")),
                "",
            ]
        )
        rows.append(
            [
                tag,
                "  same runs, server span (no client wait in it): ms/step",
                fmt(span),
                fmt(raw),
                fmt(dbos_step),
                x(t["ratios"]["harvest_span_over_raw_celery"]),
                x(span / dbos_step if dbos_step else None),
            ]
        )
    for lv in _get(res, "throughput", "levels") or []:
        rows.append(
            [
                "B2",
                f"throughput, {lv['inflight']} in flight: steps/s",
                fmt(lv["harvest"].get("steps_per_s"), 1),
                fmt(lv["raw_celery"].get("steps_per_s"), 1),
                fmt(lv["dbos"].get("steps_per_s"), 1),
                x(lv["raw_over_harvest"]),
                x(lv["dbos_over_harvest"]),
            ]
        )
        if lv.get("repeats_raw_over_harvest"):
            rows.append(
                [
                    "B2",
                    "  median of per-repeat ratios (min–max)",
                    "",
                    "",
                    "",
                    xs(lv["repeats_raw_over_harvest"]),
                    "",
                ]
            )
    fan = res.get("fanout")
    if fan and "error" not in fan:
        rows.append(
            [
                "B4",
                f"fan-out {fan['cells']} cells + unwind: s (raw: {fan['cells']} undo tasks)",
                fmt(fan["harvest"]["wall_s"]),
                fmt(fan["raw_celery"]["per_cell_undo_s"]),
                fmt(fan["dbos"].get("wall_s")),
                x(fan["ratios"]["harvest_over_raw_per_cell_undo"]),
                x(fan["ratios"]["harvest_over_dbos"]),
            ]
        )
        rows.append(
            [
                "B4",
                "  same, raw Celery with one batch undo task (like for like)",
                fmt(fan["harvest"]["wall_s"]),
                fmt(fan["raw_celery"]["batch_undo_s"]),
                "",
                x(fan["ratios"]["harvest_over_raw_batch_undo"]),
                "",
            ]
        )
    cv = res.get("canvas")
    if cv and "error" not in cv:
        rows.append(
            [
                "B5",
                f"chord of {cv['cells']} + body, start_canvas vs plain chord: s (median of {cv['repeats']})",
                fmt(cv["harvest"]["wall_s"]),
                fmt(cv["raw_celery"]["wall_s"]),
                "",
                x(cv["ratios"]["harvest_over_raw"]),
                "",
            ]
        )
    return rows


def history_rows(res: dict[str, Any]) -> list[Row]:
    """Topology | steps | early ms | late ms | late÷early."""
    hist = res.get("history")
    if not hist or "error" in hist:
        return []
    rows = []
    chain = [hist["chain"]] if "chain" in hist else []
    for t in list(hist["topologies"].values()) + chain + [dict(hist["dbos"], label="DBOS (in process)")]:
        if "error" in t:
            rows.append([t.get("label", "?"), "error: " + t["error"][:80], "", "", ""])
            continue
        w = t["window"]
        rows.append(
            [
                t["label"],
                fmt(t["steps"]),
                f"{fmt(t['early_mean_ms'])} (1–{w})",
                f"{fmt(t['late_mean_ms'])} ({t['steps'] - w + 1}–{t['steps']})",
                x(t["late_over_early"]),
            ]
        )
    return rows


def schedule_rows(res: dict[str, Any]) -> list[Row]:
    """System | ticks fired | median ms | p99 ms | max ms | median, p99 ÷ Beat."""
    sched = res.get("schedules")
    if not sched or "error" in sched:
        return []
    rows = []
    for t in sched["systems"].values():
        if "median_ms" not in t:
            rows.append([t["label"], f"{t['fired']}/{t['ticks']}", "", "", "", ""])
            continue
        rows.append(
            [
                t["label"],
                f"{t['fired']}/{t['ticks']}",
                fmt(t["median_ms"]),
                fmt(t["p99_ms"]),
                fmt(t["max_ms"]),
                f"{x(t['median_over_beat'])} / {x(t['p99_over_beat'])}" if "median_over_beat" in t else "",
            ]
        )
    return rows


def memory_rows(res: dict[str, Any]) -> list[Row]:
    m = res.get("memory")
    if not m or "error" in m:
        return []
    mib = 1024.0
    b, a = m["before"], m["after"]
    return [
        ["VmRSS (MiB)", fmt((b["vmrss_kib"] or 0) / mib, 1), fmt((a["vmrss_kib"] or 0) / mib, 1)],
        ["VmHWM, peak RSS (MiB)", fmt((b["vmhwm_kib"] or 0) / mib, 1), fmt((a["vmhwm_kib"] or 0) / mib, 1)],
        ["warm sessions", fmt(b["warm_sessions"]), fmt(a["warm_sessions"])],
        ["RSS growth per warm run (KiB)", "", fmt(m["rss_growth_kib_per_run"], 1)],
    ]


BUDGET_KEYS = (
    ("pg_transactions", "Postgres transactions the engine commits (SQLAlchemy)"),
    ("round_trips", "Postgres round trips the engine issues (SQLAlchemy)"),
    ("statements", "SQL statements"),
    ("published", "broker messages published"),
    ("tasks_run", "tasks run (deliveries)"),
    ("redis_commands", "Redis commands (server-wide, idle polling subtracted)"),
)


def budget_rows(res: dict[str, Any]) -> list[Row]:
    """Per step, worker side, one column per B1 topology (probe counters)."""
    tops = [v for v in (_get(res, "sequential", "topologies") or {}).values() if "budget" in v]
    if not tops:
        return []
    rows = []
    for key, label in BUDGET_KEYS:
        rows.append([label] + [fmt(t["budget"]["workers_per_step"].get(key)) for t in tops])
    rows.append(
        ["+ transactions the probes do not see (driver SETs, connection set-up; pg_stat_database − counted)"]
        + [fmt(t["pg_stat_database"]["uncounted_transactions_per_step"]) for t in tops]
    )
    rows.append(
        ["= Postgres transactions, as Postgres counts them"]
        + [fmt(_get(t, "budget", "postgres_view_per_step", "pg_transactions")) for t in tops]
    )
    rows.append(
        ["= Postgres round trips, engine + driver"]
        + [fmt(_get(t, "budget", "postgres_view_per_step", "round_trips")) for t in tops]
    )
    rows.append(
        ["pg_stat_database xact_commit ÷ steps (whole segment, incl. per-run and idle work)"]
        + [fmt(t["pg_stat_database"]["xact_commit_per_step"]) for t in tops]
    )
    rows.append(
        ["pg_stat_database rows written ÷ steps (whole segment)"]
        + [fmt(t["pg_stat_database"]["rows_written_per_step"]) for t in tops]
    )
    rows.append(
        ["WAL fsyncs ÷ steps (pg_stat_wal, cluster-wide, whole segment)"]
        + [fmt(t["pg_stat_database"].get("wal_syncs_per_step")) for t in tops]
    )
    return rows


def phase_rows(res: dict[str, Any]) -> list[Row]:
    """B1 phases (median ms) per topology, and the floor estimate from the measured budget."""
    tops = [v for v in (_get(res, "sequential", "topologies") or {}).values() if "harvest" in v]
    if not tops:
        return []
    rows = [
        [label] + [fmt(_get(t, "harvest", "phases", key, "median_ms")) for t in tops]
        for key, label in (
            ("decision", "Completed→Scheduled (completion commit, decision)"),
            ("dispatch_claim", "Scheduled→Started (decision commit, hop or eager, claim)"),
            ("body_complete", "Started→Completed (claim commit, body)"),
        )
    ]
    rows.append(
        ["harvest step, client start→result"] + [fmt(t["harvest"]["per_step"]["median_ms"]) for t in tops]
    )
    rows.append(
        ["floor estimate: commits × commit latency + messages × raw chain step"]
        + [fmt(_get(t, "floor", "estimate_ms")) for t in tops]
    )
    return rows


def tracing_rows(res: dict[str, Any]) -> list[Row]:
    """The tracing scenario: per topology, harvest's median ms per step off and on, on÷off, the
    same against each segment's raw Celery (drift between the segments divided out), and each
    segment's harvest÷raw Celery (the median of interleaved rounds)."""
    rows: list[Row] = []
    for t in (_get(res, "tracing", "topologies") or {}).values():
        r = t["ratios"]
        rows.append(
            [
                t.get("label", ""),
                fmt(_get(t, "off", "harvest", "per_step", "median_ms")),
                fmt(_get(t, "on", "harvest", "per_step", "median_ms")),
                x(r["on_over_off"]),
                x(r.get("on_over_off_against_raw")),
                xs(r["rounds_off_over_raw_celery"]),
                xs(r["rounds_on_over_raw_celery"]),
                str(t["on"].get("worker_spans")),
            ]
        )
    return rows


def admission_rows(res: dict[str, Any]) -> list[Row]:
    """The admission scenario: 64 in flight over 4 keys at concurrency=16 against unlimited and
    raw Celery (steps/s, cost ratios), and the hot key's admissions/s and latency after a close."""
    a = res.get("admission")
    if not a:
        return []
    k, h = a.get("keyed", {}), a.get("hot", {})
    rows: list[Row] = []
    if "error" in k:
        rows.append(["64 in flight, 4 keys, concurrency=16", k["error"]])
    else:
        per_s = k["steps_per_s"]
        rows += [
            [
                "steps/s: limited / unlimited / raw Celery",
                f"{fmt(per_s['limited'], 0)} / {fmt(per_s['unlimited'], 0)} / {fmt(per_s['raw'], 0)}",
            ],
            [
                "limited÷unlimited (cost)",
                f"{x(k['limited_over_unlimited'])} {xs(k['repeats_limited_over_unlimited'])}",
            ],
            ["limited÷raw, unlimited÷raw", f"{x(k['limited_over_raw'])}, {x(k['unlimited_over_raw'])}"],
        ]
    if "error" not in h and h:
        lat = h["latency_ms"]
        rows += [
            [
                f"hot key ({h['runs']} runs, concurrency={h['concurrency']}): admissions/s",
                fmt(h["admissions_per_s"], 1),
            ],
            [
                "admission latency after a close, median / p95 / max (ms)",
                f"{fmt(lat['median'])} / {fmt(lat['p95'])} / {fmt(lat['max'])}",
            ],
        ]
        onward = h.get("first_step_after_admission_ms")
        if onward:
            rows.append(
                [
                    "admission to its first step scheduled, median / p95 / max (ms)",
                    f"{fmt(onward['median'])} / {fmt(onward['p95'])} / {fmt(onward['max'])}",
                ]
            )
    return rows


def micro_rows(res: dict[str, Any]) -> list[Row]:
    m = res.get("micro")
    if not m or "error" in m:
        return []
    rows = [
        [
            f"decide() at {r['events']} events: cold replay / warm session (µs)",
            f"{fmt(r['us_per_decision'], 1)} / {fmt(r['us_per_warm_decision'], 1)}",
        ]
        for r in _get(m, "decide", "rows") or []
    ]
    if "error" not in m.get("codec", {"error": 1}):
        c = m["codec"]
        rows.append(
            [
                f"payload codec on a {c['event_bytes']} B event: none / Fernet (µs)",
                f"{fmt(c['plain_us'], 1)} / {fmt(c['fernet_us'], 1)}",
            ]
        )
    if "median_ms" in m.get("commit", {}):
        rows.append(["one single-row Postgres commit, median (ms)", fmt(m["commit"]["median_ms"])])
    return rows


def markdown(header: Row, rows: list[Row]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def text(header: Row, rows: list[Row]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *rows]
    ]
    return "\n".join(out)


def limits_rows(res: dict[str, Any]) -> list[list[str]]:
    """The limits scenario: a concurrency limit's cost, a rate limit's accuracy."""
    c = _get(res, "limits", "concurrency") or {}
    r = _get(res, "limits", "rate") or {}
    rows = []
    if "limited_over_unlimited" in c:
        rows.append(
            [
                f"concurrency=16 ÷ unlimited, {c['inflight']} in flight (steps/s)",
                f"{c['limited_steps_per_s']:.0f} ÷ {c['unlimited_steps_per_s']:.0f} = "
                f"{c['limited_over_unlimited']:.2f}",
            ]
        )
    if "open_over_unlimited" in c:
        rows.append(
            [
                "same, override 1000: no row waits (steps/s)",
                f"{c['open_steps_per_s']:.0f} ÷ {c['unlimited_steps_per_s']:.0f} = {c['open_over_unlimited']:.2f}",
            ]
        )
    if "keyed_over_unlimited" in c:
        rows.append(
            [
                f"limit_key, {c['keyed_keys']} keys at concurrency={c['keyed_concurrency_per_key']} each "
                "÷ unlimited (steps/s; ÷ one key)",
                f"{c['keyed_steps_per_s']:.0f} ÷ {c['unlimited_steps_per_s']:.0f} = "
                f"{c['keyed_over_unlimited']:.2f} ({c['keyed_over_one_key']:.2f}× one key)",
            ]
        )
    if "achieved_per_s" in r:
        late = r["release_lateness_ms"]
        rows += [
            ["rate 20/s, one key: achieved ÷ configured", f"{r['achieved_over_configured']:.3f}"],
            [
                "release lateness (ms): median / p95 / max",
                f"{late['median']:.1f} / {late['p95']:.1f} / {late['max']:.1f}",
            ],
            [
                f"{r['calls']} calls at 20/s: wall ÷ nominal {r['nominal_s']:.2f} s",
                f"{r['wall_s']:.2f} s = {r['wall_over_nominal']:.3f}",
            ],
        ]
    return rows


def tables(res: dict[str, Any], md: bool) -> str:
    render = markdown if md else text
    tops = [
        v.get("label", k) for k, v in (_get(res, "sequential", "topologies") or {}).items() if "budget" in v
    ]
    parts = [
        (
            "Ratios (harvest's cost ÷ the baseline's; > 1 = harvest slower)",
            ["", "scenario", "harvest", "raw Celery", "DBOS", "harvest÷raw", "harvest÷DBOS"],
            main_rows(res),
        ),
        (
            "B3 step cost against history length (mean ms per step)",
            ["topology", "steps", "early", "late", "late÷early"],
            history_rows(res),
        ),
        (
            f"Schedule lateness: {_get(res, 'schedules', 'schedules')} schedules every "
            f"{_get(res, 'schedules', 'every_s')} s, {_get(res, 'schedules', 'rounds')} ticks (run creation "
            "minus nominal tick, ms)",
            ["", "fired", "median", "p99", "max", "median / p99 ÷ Beat"],
            schedule_rows(res),
        ),
        (
            "Memory: decision worker holding warm runs",
            ["", "before", f"after {_get(res, 'memory', 'runs')} warm runs"],
            memory_rows(res),
        ),
        ("Per-step budget, worker side (B1 probe run)", ["per step", *tops], budget_rows(res)),
        ("B1 phases (median ms, from the history's stamps)", ["", *tops], phase_rows(res)),
        ("In-process micro-benchmarks", ["", "value"], micro_rows(res)),
        (
            "B1 with tracing on against off (ms per step, median)",
            [
                "topology",
                "off",
                "on",
                "on÷off",
                "on÷off against raw",
                "off: harvest÷raw",
                "on: harvest÷raw",
                "spans (workers)",
            ],
            tracing_rows(res),
        ),
        ("Activity limits (2 processes, each every queue)", ["", "value"], limits_rows(res)),
        ("Workflow admission", ["", "value"], admission_rows(res)),
    ]
    out = []
    for title, header, rows in parts:
        if rows:
            out += [f"### {title}" if md else title, "", render(header, rows), ""]
    return "\n".join(out)


# ── plots ────────────────────────────────────────────────────────────────────────────────────
def _rolling(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_history(res: dict[str, Any], path: Path) -> bool:
    hist = res.get("history")
    if not hist or "error" in hist:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = [(t["label"], t) for t in hist["topologies"].values() if "series_ms" in t]
    if "series_ms" in hist.get("dbos", {}):
        series.append(("DBOS (in process)", hist["dbos"]))
    window = max(5, hist["steps"] // 40)
    for label, t in series:
        ys = _rolling(t["series_ms"], window)
        ax.plot(range(1, len(ys) + 1), ys, label=label, linewidth=1.4)
    ax.set_xlabel("step k (the history holds ≈ 3k events when it is decided)")
    ax.set_ylabel(f"step cost, ms (rolling mean of {window})")
    ax.set_title(f"B3: step cost against history length ({hist['steps']} sequential steps)")
    _save(plt, fig, ax, path)
    return True


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> None:
    """The finish both plots share: axis from 0, grid, legend, written as a PNG."""
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(res: dict[str, Any], path: Path) -> bool:
    levels = _get(res, "throughput", "levels")
    if not levels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, label in (
        ("harvest", "harvest-celery"),
        ("raw_celery", "raw Celery (client-waited)"),
        ("dbos", "DBOS (in process)"),
    ):
        pts = [(lv["inflight"], lv[key]["steps_per_s"]) for lv in levels if "steps_per_s" in lv[key]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks([lv["inflight"] for lv in levels], [str(lv["inflight"]) for lv in levels])
    ax.set_xlabel("workflows in flight")
    ax.set_ylabel("steps / s")
    ax.set_title(
        f"B2: throughput, {res['throughput']['steps']}-step workflows, {res['throughput']['topology']}"
    )
    _save(plt, fig, ax, path)
    return True


def plots(res: dict[str, Any], directory: Path) -> list[Path]:
    written = []
    for name, fn in (
        ("step_cost_vs_history.png", plot_history),
        ("throughput_vs_inflight.png", plot_throughput),
    ):
        try:
            if fn(res, directory / name):
                written.append(directory / name)
        except ImportError:
            print(f"no plot {name}: matplotlib is not installed (pip install -e '.[bench]')")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("json", nargs="?", type=Path, default=RESULTS / "latest.json")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--plots-dir", type=Path)
    args = parser.parse_args(argv)
    res = json.loads(args.json.read_text())
    print(tables(res, args.markdown))
    if args.plots_dir:
        for path in plots(res, args.plots_dir):
            print(f"plot written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
