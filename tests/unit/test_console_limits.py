"""The console's limits page (docs/flow-control.md, "Seeing it"): each limited activity with its
use and its declared and override values, an override with the time it was set; read-only; no
key ever on the page; behind the console's sign-in like every page. Embedded SQLite."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from harvest_celery import Harvest, WorkflowContext, activity, workflow
from harvest_celery._web.api import create_app

TOKEN = "t0ken"
SECRET_KEY = "merchant-4711-secret"


@activity(name="cl.charge", concurrency=2, limit_key=lambda order: order["merchant"])
def cl_charge(order: dict[str, str]) -> str:
    return order["merchant"]


@activity(name="cl.mail", rate_limit="5/s")
def cl_mail(x: object) -> object:
    return x


@workflow(name="cl.pay")
async def cl_pay(ctx: WorkflowContext, order: dict[str, str]) -> object:
    await ctx.execute_activity(cl_mail, 1)
    return await ctx.execute_activity(cl_charge, order)


def _harvest(tmp_path) -> Harvest:
    h = Harvest(f"sqlite:///{tmp_path / 'cl.db'}").register(cl_pay, cl_charge, cl_mail)
    h.migrate()
    h.start_workflow("cl.pay", {"merchant": SECRET_KEY}, execution_id="o-1")
    assert h.result("o-1") == SECRET_KEY  # both limits' rows exist once a dispatch wrote them
    return h


def _row(html: str, name: str) -> str:
    found = re.search(rf'<tr data-limit="{re.escape(name)}">.*?</tr>', html, re.S)
    assert found, f"no row for {name}"
    return found.group(0)


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()


def test_the_limits_page_shows_use_and_declared_values(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    html = TestClient(create_app(_harvest(tmp_path))).get("/console/limits")
    assert html.status_code == 200, html.text
    charge = _row(html.text, "cl.charge")
    assert _text(re.search(r'<td class="in-use">.*?</td>', charge).group(0)) == "0 / 2"
    assert _text(re.search(r'<td class="keys">.*?</td>', charge).group(0)) == "1"
    assert "2 (declared)" in _text(charge) and 'class="override"' not in charge
    assert "5/s (declared)" in _text(_row(html.text, "cl.mail"))
    assert '<a href="/console/limits">Limits</a>' in html.text  # in the console's navigation
    assert "<form" not in html.text.split("</nav>", 1)[1]  # read-only: no action on the page


def test_an_override_is_shown_with_its_set_time_and_goes_when_cleared(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    h = _harvest(tmp_path)
    h.set_limit("cl.charge", 0)
    h.set_limit("cl.mail", rate_limit="1/m")
    client = TestClient(create_app(h))
    page = client.get("/console/limits").text
    (entry,) = [x for x in h.limits() if x["name"] == "cl.charge"]
    charge = _row(page, "cl.charge")
    assert "0 (override; declared 2)" in _text(charge) and "0 / 0" in _text(charge)
    assert (
        _text(re.search(r'<td class="set-at">.*?</td>', charge).group(0))
        == entry["override_set_at"].isoformat()
    )
    assert "1/m (override; declared 5/s)" in _text(_row(page, "cl.mail"))
    h.set_limit("cl.charge", clear=True)
    charge = _row(client.get("/console/limits").text, "cl.charge")
    assert "2 (declared)" in _text(charge) and "override" not in charge


def test_no_key_is_ever_shown(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    page = TestClient(create_app(_harvest(tmp_path))).get("/console/limits").text
    assert SECRET_KEY not in page and "merchant-4711" not in page


def test_the_page_needs_a_session_when_a_token_is_set(tmp_path):
    client = TestClient(create_app(_harvest(tmp_path), token=TOKEN), follow_redirects=False)
    response = client.get("/console/limits")
    assert response.status_code in (302, 303, 307) and "/console/login" in response.headers["location"]
    signed = client.get("/console/limits", headers={"Authorization": f"Bearer {TOKEN}"})
    assert signed.status_code == 200 and 'data-limit="cl.charge"' in signed.text
