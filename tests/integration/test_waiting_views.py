"""A run waiting for admission as operators see it on Postgres, with real workers holding the
slot (issue 24, "Visibility"; docs/flow-control.md, "Seeing it"): ``describe()``, ``harvest
show``, the HTTP API (status, place, and a list filtered on WAITING) and the console's run page
all give WAITING with its place, "3rd of 3 waiting; 1/1 in use". ``admission_app``'s
``adm_customer`` admits one run per customer; two workers of this module's own run it. The
embedded twins of these checks (and the activity slot line) are tests/unit/test_waiting_views.py."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harvest_celery._cli import main
from harvest_celery._web.api import create_app

from .conftest import Worker, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def adm(harvest: Any, redis_client: Any) -> Iterator[Any]:
    """The admission app and two workers, each deciding and running bodies (as test_admission)."""
    suffix = f"_v{os.environ.get('HARVEST_TEST_SLOT', '0')}_{uuid.uuid4().hex[:8]}"
    os.environ["HARVEST_TEST_ADM_SUFFIX"] = suffix  # before the import; the workers inherit it
    from tests.integration import admission_app

    assert admission_app.DECIDE.endswith(suffix), "admission_app was imported before the fixture"
    queues = f"{admission_app.DECIDE},{admission_app.QUEUE}"
    env = {"HARVEST_TEST_ADM_SUFFIX": suffix, "HARVEST_METRICS_PORT": ""}
    workers = [Worker(f"wv{i}", queues, dict(env), app="tests.integration.admission_app") for i in (1, 2)]
    try:
        for w in workers:
            w.start()
        yield admission_app
    finally:
        for w in workers:
            w.stop()


def _started(redis_client: Any, customer: str) -> list[str]:
    import json

    return [
        m["label"]
        for m in map(json.loads, redis_client.lrange(f"adm:{customer}", 0, -1))
        if m["what"] == "start"
    ]


def test_a_waiting_run_shows_its_place_everywhere(adm, redis_client, tag, capsys, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    h = adm.harvest
    customer = f"c-{tag}"
    holder = h.start_workflow(
        "adm_customer", {"customer": customer, "label": f"{tag}-0", "hold": True}, f"{tag}-0"
    )
    wait_for(lambda: _started(redis_client, customer) == [f"{tag}-0"], what="the holder's body to start")
    waiting = [
        h.start_workflow("adm_customer", {"customer": customer, "label": f"{tag}-{i}"}, f"{tag}-{i}")
        for i in (1, 2, 3)
    ]
    place = "waiting for admission to adm_customer: 3rd of 3 waiting; 1/1 in use"
    try:
        x = h.describe(waiting[2])
        assert x.display_status == "WAITING" and (x.admission["position"], x.admission["waiting"]) == (3, 3)
        assert h.describe(holder).display_status == "RUNNING" and h.describe(holder).admission is None

        assert main(["--database-url", h.database_url, "show", waiting[2]]) == 0
        out = capsys.readouterr().out
        assert "WAITING" in out.splitlines()[0] and f"  {place}\n" in out

        client = TestClient(create_app(h))
        body = client.get(f"/workflows/{waiting[2]}").json()
        assert body["display_status"] == "WAITING"
        assert {k: body["admission"][k] for k in ("position", "waiting", "in_use", "concurrency")} == {
            "position": 3,
            "waiting": 3,
            "in_use": 1,
            "concurrency": 1,
        }
        listed = client.get(
            "/workflows", params={"status": "WAITING", "workflow": "adm_customer", "limit": 1000}
        )
        ids = {r["execution_id"] for r in listed.json()["workflows"]}
        assert set(waiting) <= ids and holder not in ids

        page = client.get(f"/console/runs/{waiting[2]}").text
        found = re.search(r'<span class="flag" id="run-admission">(.*?)</span>', page, re.S)
        assert found and found.group(1).strip() == place
    finally:
        redis_client.set(f"release:{tag}-0", 1)
        for run_id in (holder, *waiting):
            h.result(run_id, timeout=120)
    assert h.describe(waiting[2]).display_status == "COMPLETED"
