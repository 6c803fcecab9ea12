"""The run-graph API's responses, byte for byte, on recorded runs (``rungraph_cases``): success
(a node that took three attempts), failure, a start-to-close timeout, a cancel with one node
started and one never started, a live run in the same state, a compensation unwind, and a DAG
retry from a node (the failed source run and its forked run).

The golden responses in ``golden/rungraph/<case>.json`` were made from the code before the
activity fold moved into ``_core``; they must never change by themselves. To re-make one (only
for a new case): ``HARVEST_GOLDEN_RECORD=1 python -m pytest tests/unit/test_rungraph_golden.py``.
"""

from __future__ import annotations

import json
import os

import pytest
from fastapi.testclient import TestClient

from harvest_celery._web.api import create_app
from tests.unit.rungraph_cases import CASES, HERE, harvest_at, load, recorded


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    h = harvest_at(f"sqlite:///{tmp_path / 'golden.db'}")
    return h, TestClient(create_app(h))


@pytest.mark.parametrize("case", CASES)
def test_the_run_graph_response_is_the_golden_one(client, case):
    h, api = client
    run = recorded(case)
    run_id = load(h, run)
    response = api.get(f"/dags/{run['dag']}/runs/{run_id}")
    assert response.status_code == 200, response.text
    golden = HERE / f"{case}.json"
    if os.environ.get("HARVEST_GOLDEN_RECORD") == "1":
        golden.write_bytes(response.content)
    assert response.content == golden.read_bytes()


def test_the_cases_cover_every_status_a_recorded_run_reaches():
    seen = {
        node["status"] for case in CASES for node in json.loads((HERE / f"{case}.json").read_bytes())["nodes"]
    }
    assert seen == {"succeeded", "failed", "timed_out", "cancelled", "running", "pending", "skipped"}
