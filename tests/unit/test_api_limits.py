"""The limits endpoints over an embedded Harvest: list with use, set an override, clear it; the
same token auth as every mutating endpoint; bad input 400/404/422 and nothing written."""

from __future__ import annotations

from fastapi.testclient import TestClient

from harvest_celery import Harvest, WorkflowContext, activity, workflow
from harvest_celery._web.api import create_app

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@activity(name="al.charge", concurrency=2)
def al_charge(order: object) -> object:
    return order


@workflow(name="al.pay")
async def al_pay(ctx: WorkflowContext, order: object) -> object:
    return await ctx.execute_activity(al_charge, order)


def _client(tmp_path) -> tuple[Harvest, TestClient]:
    h = Harvest(f"sqlite:///{tmp_path / 'l.db'}").register(al_pay, al_charge)
    h.migrate()
    h.start_workflow("al.pay", {"id": 1}, execution_id="o-1")
    assert h.result("o-1") == {"id": 1}  # the limit's row exists once a dispatch wrote it
    return h, TestClient(create_app(h, token=TOKEN))


def _charge(client: TestClient) -> dict[str, object]:
    listed = client.get("/limits", headers=AUTH)
    assert listed.status_code == 200
    return next(e for e in listed.json()["limits"] if e["name"] == "al.charge")


def test_limits_over_http(tmp_path):
    h, client = _client(tmp_path)
    before = _charge(client)
    assert (before["declared_concurrency"], before["override_concurrency"], before["in_use"]) == (2, None, 0)
    assert client.put("/limits/al.charge", json={"concurrency": 0}).status_code == 401  # no token
    assert _charge(client)["override_concurrency"] is None
    set_ = client.put("/limits/al.charge", json={"concurrency": 0}, headers=AUTH)
    assert set_.status_code == 200 and set_.json()["override_concurrency"] == 0
    assert set_.json()["override_set_at"] is not None
    assert h.limits()[0]["override_concurrency"] == 0  # stored, as set_limit stores it
    cleared = client.delete("/limits/al.charge", headers=AUTH)
    assert cleared.status_code == 200 and cleared.json()["override_concurrency"] is None
    assert cleared.json()["declared_concurrency"] == 2


def test_bad_input_is_refused_and_writes_nothing(tmp_path):
    h, client = _client(tmp_path)
    unknown = client.put("/limits/nope", json={"concurrency": 1}, headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"] == "UnknownActivity"
    assert client.delete("/limits/nope", headers=AUTH).status_code == 404
    for body in (
        {"concurrency": -1},
        {"concurrency": 2**31},
        {"concurrency": "2"},
        {"concurrency": True},
        {},
    ):
        assert client.put("/limits/al.charge", json=body, headers=AUTH).status_code == 422, body
    assert h.limits()[0]["override_concurrency"] is None and h.limits()[0]["override_set_at"] is None


def test_a_rate_override_over_http_is_checked_set_and_cleared(tmp_path):
    h, client = _client(tmp_path)
    for bad in ("ten per second", "0/s", "20/d"):
        refused = client.put("/limits/al.charge", json={"rate_limit": bad}, headers=AUTH)
        assert refused.status_code == 400 and "rate_limit must be" in refused.json()["detail"], bad
    assert client.put("/limits/al.charge", json={"rate_limit": 20}, headers=AUTH).status_code == 422
    assert h.limits()[0]["override_rate_limit"] is None and h.limits()[0]["override_set_at"] is None
    set_ = client.put("/limits/al.charge", json={"rate_limit": "5/s"}, headers=AUTH)
    assert set_.status_code == 200, set_.text
    entry = set_.json()
    assert (entry["override_rate_limit"], entry["override_concurrency"], entry["declared_rate_limit"]) == (
        "5/s",
        None,
        None,
    )
    assert entry["override_set_at"] is not None
    cleared = client.delete("/limits/al.charge", headers=AUTH).json()
    assert (cleared["override_rate_limit"], cleared["override_set_at"]) == (None, None)
