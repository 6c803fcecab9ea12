"""The deployments matrix (docs/performance.md): one table from the JSON of several runs, one run
per cell (pool × broker × topology), each holding B1 and B2 against raw Celery on the same workers.

    for pool in prefork threads; do for broker in redis amqp; do for top in split shared; do
      flock /work/it.lock python -m benchmarks.run --quick --skip-dbos \\
        --scenarios sequential,throughput --inflight 16,64 --runs 5 --repeats 5 \\
        --pool $pool --broker $broker --topology $top \\
        --json benchmarks/results/matrix-$pool-$broker-$top.json
    done; done; done
    python -m benchmarks.matrix benchmarks/results/matrix-*.json

Ratios are harvest's cost over raw Celery's (> 1 = harvest slower): B1 the median of the
per-round ratios (ms per step), B2 the median of the per-repeat ratios (raw steps/s ÷ harvest
steps/s), each with its min–max. ``warm`` is ``harvest_decision_replays_total{replay="warm"}``
over all replays in that segment, every worker process and prefork child summed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = (
    "| pool | broker | topology | B1 ms/step h vs raw | B1 ratio (min–max) | B1 warm "
    "| B2@16 steps/s h vs raw | B2@16 ratio (min–max) | B2@16 warm "
    "| B2@64 steps/s h vs raw | B2@64 ratio (min–max) | B2@64 warm |"
)


def _spread(s: dict[str, Any] | None) -> str:
    if not s or not s.get("n"):
        return "—"
    return f"{s['median']:.2f}× ({s['min']:.2f}–{s['max']:.2f}, n={s['n']})"


def _warm(r: dict[str, Any] | None) -> str:
    rate = (r or {}).get("hit_rate")
    return "—" if rate is None else f"{100 * rate:.0f}%"


def row(res: dict[str, Any]) -> str:
    cfg = res["config"]
    cells = [cfg["pool"], cfg["broker"], cfg.get("topology") or cfg["b2_topology"]]
    tops = ((res.get("sequential") or {}).get("topologies") or {}).values()
    b1 = next(iter(tops), None)
    if b1 and "ratios" in b1:
        h = b1["harvest"]["per_step"]["median_ms"]
        raw = b1["raw_celery"]["client_waited"]["per_step"]["median_ms"]
        cells += [f"{h:.2f} vs {raw:.2f}", _spread(b1["ratios"]["rounds_harvest_over_raw_celery"])]
        cells.append(_warm(b1.get("replays")))
    else:
        cells += ["—", (res.get("sequential") or {}).get("error", "—")[:40], "—"]
    levels = {lv["inflight"]: lv for lv in (res.get("throughput") or {}).get("levels", [])}
    for c in (16, 64):
        lv = levels.get(c)
        if lv is None or "steps_per_s" not in lv["harvest"]:
            cells += ["—", "—", "—"]
            continue
        cells.append(f"{lv['harvest']['steps_per_s']:.0f} vs {lv['raw_celery']['steps_per_s']:.0f}")
        cells.append(_spread(lv["repeats_raw_over_harvest"]))
        cells.append(_warm(lv["harvest"].get("replays")))
    return "| " + " | ".join(cells) + " |"


def table(paths: list[Path]) -> str:
    rows = [row(json.loads(p.read_text())) for p in sorted(paths)]
    return "\n".join([HEADER, _rule(), *rows])


def _rule() -> str:
    return "|" + "---|" * (HEADER.count("|") - 1)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    print(table([Path(a) for a in argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
