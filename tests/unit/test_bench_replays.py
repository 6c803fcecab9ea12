"""The benchmark harness's warm-session hit rate (benchmarks/common.py): every worker process,
prefork children included, writes ``harvest_decision_replays_total`` into the cluster's
``PROMETHEUS_MULTIPROC_DIR``, and the harness sums the files, from processes alive or exited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import TOPOLOGIES, hit_rate, read_replays, split_topology

_CHILD = """
from harvest_celery._runtime.metrics import METRICS
for replay, n in (("warm", {warm}), ("cold", {cold})):
    for _ in range(n):
        METRICS.inc("decision_replays", {{"replay": replay}})
"""


def _process(metrics_dir: Path, warm: int, cold: int) -> None:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    subprocess.run([sys.executable, "-c", _CHILD.format(warm=warm, cold=cold)], env=env, check=True)


def test_replays_are_summed_over_processes_that_exited(tmp_path: Path) -> None:
    assert read_replays(str(tmp_path)) == {"warm": 0.0, "cold": 0.0}
    _process(tmp_path, warm=3, cold=1)
    before = read_replays(str(tmp_path))
    _process(tmp_path, warm=5, cold=3)  # a second process (another child, another worker)
    after = read_replays(str(tmp_path))
    assert after == {"warm": 8.0, "cold": 4.0}
    assert hit_rate(before, after) == {"warm": 5.0, "cold": 3.0, "hit_rate": 5 / 8}


def test_split_topology_names_its_processes() -> None:
    assert split_topology(1, 1) == "split"
    name = split_topology(2, 4)
    assert [role for role, _ in TOPOLOGIES[name]] == ["decision"] * 2 + ["activity"] * 4
    assert {queues for role, queues in TOPOLOGIES[name] if role == "activity"} == {"default,bench"}
