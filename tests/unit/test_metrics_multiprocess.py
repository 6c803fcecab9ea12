"""Counters incremented in several processes (Celery prefork children) are aggregated by the
metrics endpoint when PROMETHEUS_MULTIPROC_DIR is set — checked with real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_counters_from_several_processes_are_aggregated(tmp_path):
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    child = textwrap.dedent("""
        from harvest_celery._runtime.metrics import METRICS
        METRICS.inc("saga_compensated", {"workflow": "checkout"})
        METRICS.inc("saga_compensated", {"workflow": "checkout"})
    """)
    for _ in range(3):  # three "pool children"
        subprocess.run([sys.executable, "-c", child], env=env, check=True)
    reader = textwrap.dedent("""
        from harvest_celery._runtime.metrics import exposition
        print(exposition()[0].decode())
    """)
    text = subprocess.run(
        [sys.executable, "-c", reader], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert 'harvest_saga_compensated_total{workflow="checkout"} 6.0' in text
