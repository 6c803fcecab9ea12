"""The web console in a real headless browser (Debian's chromium driven by Playwright), served by
uvicorn over the operator API with a token, against real Postgres and the shared real workers.

Every page is checked for its content and photographed (the screenshots are written by the test
to its tmp dir); each operator action is done through the page's own forms; an activity error
holding ``<script>`` is shown as text; a cross-site form post from another origin changes
nothing. Nothing here skips: a missing chromium or playwright fails the test.
"""

from __future__ import annotations

import http.server
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from harvest_celery._errors import WorkflowFailed
from harvest_celery._web.api import create_app
from tests.integration.app import XSS_MESSAGE
from tests.integration.browser import chromium, serving
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

TOKEN = "console-t0ken-" + "x" * 20


@pytest.fixture(scope="module")
def server(harvest: Any, workers: Any, redis_client: Any) -> Iterator[str]:
    """uvicorn serving create_app(harvest, token=TOKEN) on 127.0.0.1, in a background thread."""
    app = create_app(harvest, token=TOKEN)
    with serving(app, "console") as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium("console", width=1360) as context:
        yield context


@pytest.fixture(scope="module")
def signed_in(server: str, browser: Any, tmp_path_factory: Any) -> str:
    """Sign in once through the sign-in page (the session cookie stays in the browser)."""
    page = browser.new_page()
    try:
        response = page.goto(f"{server}/console", wait_until="load")
        assert response is not None and response.status == 200
        assert urlparse(page.url).path == "/console/login"  # redirected: not signed in
        assert page.locator("form#login input[type=password]").count() == 1
        _shot(page, tmp_path_factory.mktemp("login") / "login.png")
        page.fill("#token", "wrong")
        with page.expect_navigation():
            page.click("form#login button")
        assert page.locator("#login-error").text_content() == "That is not the token."
        page.fill("#token", TOKEN)
        with page.expect_navigation():
            page.click("form#login button")
        assert urlparse(page.url).path == "/console"
        (cookie,) = [c for c in browser.cookies() if c["name"] == "harvest_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie") == ""  # HttpOnly: no script can read it
    finally:
        page.close()
    return server


def _shot(page: Any, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000, path


def _open(browser: Any, url: str) -> Any:
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.requests = requests  # every request stays on the server: no CDN
    response = page.goto(url, wait_until="load")
    assert response is not None and response.status == 200, (url, response and response.status)
    return page


def _same_origin_only(page: Any, base: str) -> None:
    foreign = [u for u in page.requests if not (u.startswith(base) or u.startswith("data:"))]
    assert foreign == []


def _settled(harvest: Any, run_id: str) -> None:
    """The run's pending decision is taken (so an open page does not reload under the test)."""
    wait_for(lambda: harvest.store.decision_request(run_id)[1] is None, what="the run's decision")


def _submit(page: Any, form: str) -> None:
    with page.expect_navigation():
        page.click(f"{form} button[type=submit]")


# ── pages ────────────────────────────────────────────────────────────────────────────────────
def test_the_runs_list_filters_and_pages(harvest, workers, tag, signed_in, browser, tmp_path):
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1))
    ids = [
        harvest.start_workflow("approval", {"tag": tag}, execution_id=f"list-{tag}-{i:02d}")
        for i in range(27)
    ]
    failed = harvest.start_workflow("console_probe", {"tag": tag})
    with pytest.raises(WorkflowFailed):
        harvest.result(failed, timeout=30)
    page = _open(browser, f"{signed_in}/console")
    assert page.locator("h1").first.text_content() == "Runs"
    assert page.locator("table.runs tbody tr").count() >= 28
    _shot(page, tmp_path / "runs.png")

    # filters: status, workflow and time, through the form
    page.select_option("#f-status", "FAILED")
    page.fill("#f-workflow", "console_probe")
    page.fill("#f-from", since[:16])
    _submit(page, "form#filters")
    rows = page.locator("table.runs tbody tr")
    assert failed in [rows.nth(i).get_attribute("data-run") for i in range(rows.count())]
    assert all(
        s == "FAILED"
        for s in page.locator("table.runs .badge").evaluate_all("els => els.map(e => e.dataset.status)")
    )
    _shot(page, tmp_path / "runs-filtered.png")
    page.goto(f"{signed_in}/console?nd_blocked=yes&workflow=approval", wait_until="load")
    assert page.locator("table.runs tbody tr").count() == 0 and page.locator("p.empty").count() == 1

    # paging: the 27 runs of this test (and any other approval run since), 25 a page, newest first
    page.goto(f"{signed_in}/console?workflow=approval&limit=25&from={since}", wait_until="load")
    assert page.locator("#prev").count() == 0
    pages = [page.locator("table.runs tbody tr").evaluate_all("els => els.map(e => e.dataset.run)")]
    while page.locator("#next").count():
        with page.expect_navigation():
            page.click("#next")
        assert page.locator("#prev").count() == 1
        pages.append(page.locator("table.runs tbody tr").evaluate_all("els => els.map(e => e.dataset.run)"))
    seen = [run for shown in pages for run in shown]
    assert len(pages) >= 2 and len(pages[0]) == 25 and all(0 < len(p) <= 25 for p in pages)
    assert len(seen) == len(set(seen)) and set(ids) <= set(seen)
    ours = [run for run in seen if run in ids]
    assert ours == sorted(ids, reverse=True)  # newest first, across pages
    _same_origin_only(page, signed_in)
    page.close()
    for run_id in ids:
        harvest.cancel_workflow_execution(run_id, reason="cleanup")


def test_an_injected_script_in_an_activity_error_is_shown_as_text(
    harvest, workers, tag, signed_in, browser, tmp_path
):
    run_id = harvest.start_workflow("console_probe", {"tag": tag, "note": "<b>bold?</b>"})
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    page = _open(browser, f"{signed_in}/console/runs/{run_id}")
    assert page.evaluate("window.__xss") is None  # neither the script nor the onerror ran
    assert page.locator("#errors script, #errors img, #activities img, #payloads b").count() == 0
    messages = page.locator("#errors .emsg").all_text_contents()
    assert messages.count(XSS_MESSAGE) == 2  # two attempts, each failed
    workflow_error = page.locator('#errors li[data-who="workflow"]')
    assert workflow_error.count() == 1 and "ActivityError" in (workflow_error.text_content() or "")
    page.locator("#errors details summary").first.click()
    assert "ValueError" in (page.locator("#errors pre.tb").first.text_content() or "")
    assert "Traceback" in (page.locator("#errors pre.tb").first.text_content() or "")
    row = page.locator('#activities tr[data-activity="console_xss"]')
    assert row.get_attribute("data-status") == "failed" and row.locator("ul.attempts li").count() == 2
    assert "<b>bold?</b>" in (page.locator("#run-input").text_content() or "")
    assert page.locator("#run-workflow").text_content() == "console_probe"
    assert page.locator("#run-id").text_content() == run_id
    assert "ActivityScheduled" in (page.locator("#timeline").text_content() or "")
    assert page.locator("body").get_attribute("data-live") is None  # a closed run is not polled
    _shot(page, tmp_path / "run-xss.png")
    _same_origin_only(page, signed_in)
    page.close()


def test_a_saga_run_shows_its_markers_compensations_and_signals(
    harvest, workers, tag, signed_in, browser, tmp_path
):
    run_id = harvest.start_workflow("saga_steps", {"tag": tag, "n": 3, "fail_at": 3})
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    signalled = harvest.start_workflow("approval", {"tag": tag})
    harvest.signal(signalled, "decision", {"ok": "<i>yes</i>"})
    harvest.result(signalled, timeout=30)

    page = _open(browser, f"{signed_in}/console/runs/{run_id}")
    markers = page.locator("#saga tr[data-marker]").evaluate_all("els => els.map(e => e.dataset.marker)")
    assert any(m.startswith("saga_compensated:") for m in markers)
    comps = page.locator("#saga tr[data-compensation]")
    assert comps.count() == 2 and {comps.nth(i).locator("td").nth(2).text_content() for i in range(2)} == {
        "completed"
    }
    assert page.locator('#activities tr[data-activity="forward"]').count() == 3
    _shot(page, tmp_path / "run-saga.png")
    page.goto(f"{signed_in}/console/runs/{signalled}", wait_until="load")
    signal = page.locator('#signals tr[data-signal="decision"]')
    assert signal.count() == 1 and '"<i>yes</i>"' in (signal.text_content() or "")
    assert page.locator("#signals i").count() == 0
    page.close()


def test_a_dag_run_is_drawn_and_retried_after_a_dry_run(harvest, workers, tag, signed_in, browser, tmp_path):
    run_id = harvest.start_workflow("retryable", {"tag": tag})
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    page = _open(browser, f"{signed_in}/console/runs/{run_id}")
    nodes = page.locator("#graph svg#dag g.node")
    assert {
        nodes.nth(i).get_attribute("data-node"): nodes.nth(i).get_attribute("data-status")
        for i in range(nodes.count())
    } == {"rt_a": "succeeded", "rt_b": "failed", "rt_c": "skipped"}
    assert page.locator("#graph a").get_attribute("href") == f"/ui/dags/retryable/runs/{run_id}"
    _shot(page, tmp_path / "run-dag.png")

    # the dry run first: a preview, nothing forked
    _submit(page, "#form-retry")
    assert page.locator("#retry-from").text_content() == "rt_b"
    assert page.locator("#carried li").all_text_contents() == ["rt_a"]
    assert page.locator("#rerun li").all_text_contents() == ["rt_b", "rt_c"]
    assert harvest.describe(run_id).forked_to is None
    _shot(page, tmp_path / "retry-preview.png")
    with page.expect_navigation():
        page.click("#confirm-retry")
    assert page.locator("#flash").text_content() == "This run retries the failed run."
    new_id = harvest.describe(run_id).forked_to
    assert new_id and page.locator("#run-id").text_content() == new_id
    assert page.locator("#forked-from").text_content() == run_id
    assert harvest.result(new_id, timeout=30)
    page.goto(f"{signed_in}/ui/dags/retryable/runs/{new_id}", wait_until="load")  # the DAG page, signed in
    assert page.locator("svg#dag g.node").count() == 3
    page.close()


# ── actions ──────────────────────────────────────────────────────────────────────────────────
def test_pause_resume_and_signal_from_the_run_page(harvest, workers, tag, signed_in, browser, tmp_path):
    run_id = harvest.start_workflow("approval", {"tag": tag})
    _settled(harvest, run_id)
    page = _open(browser, f"{signed_in}/console/runs/{run_id}")
    assert page.locator("body").get_attribute("data-live") == f"/console/runs/{run_id}/state.json"
    _shot(page, tmp_path / "run-live.png")
    _submit(page, "#form-pause")
    assert page.locator("#flash").text_content().startswith("Paused")
    assert page.locator("#run-paused").count() == 1 and harvest.describe(run_id).paused_at is not None
    _submit(page, "#form-resume")
    assert page.locator("#flash").text_content() == "Resumed."
    assert harvest.describe(run_id).paused_at is None
    _settled(harvest, run_id)
    page.fill('#form-signal input[name="name"]', "decision")
    page.fill('#form-signal textarea[name="payload"]', '"ship it"')
    _submit(page, "#form-signal")
    assert page.locator("#flash").text_content() == "Signal sent."
    assert harvest.result(run_id, timeout=30) == f"{tag}:ship it"
    page.goto(f"{signed_in}/console/runs/{run_id}", wait_until="load")
    assert page.locator("header .badge").first.get_attribute("data-status") == "COMPLETED"
    page.close()


def test_a_bad_signal_payload_is_refused_on_a_page(harvest, workers, tag, signed_in, browser):
    run_id = harvest.start_workflow("approval", {"tag": tag})
    _settled(harvest, run_id)
    page = _open(browser, f"{signed_in}/console/runs/{run_id}")
    page.fill('#form-signal input[name="name"]', "decision")
    page.fill('#form-signal textarea[name="payload"]', "{not json")
    with page.expect_navigation():
        page.click("#form-signal button[type=submit]")
    assert "the payload is not JSON" in (page.locator("#error").text_content() or "")
    assert [h.event.type for h in harvest.history(run_id)].count("SignalReceived") == 0
    harvest.cancel_workflow_execution(run_id)
    page.close()


def test_cancel_request_cancellation_and_terminate(harvest, workers, tag, signed_in, browser, tmp_path):
    cancelled, requested, terminated = (harvest.start_workflow("approval", {"tag": tag}) for _ in range(3))
    for run_id in (cancelled, requested, terminated):
        _settled(harvest, run_id)
    page = _open(browser, f"{signed_in}/console/runs/{cancelled}")
    page.fill('#form-cancel input[name="reason"]', "<operator> said so")
    _submit(page, "#form-cancel")
    assert page.locator("#flash").text_content() == "Cancelled."
    assert harvest.describe(cancelled).status == "CANCELLED"
    assert harvest.describe(cancelled).cancel_reason == "<operator> said so"

    page.goto(f"{signed_in}/console/runs/{requested}", wait_until="load")
    assert page.locator("#form-request-cancel").count() == 1
    _submit(page, "#form-request-cancel")
    assert page.locator("#flash").text_content() == "Cancellation requested."
    assert harvest.describe(requested).cancel_requested_at is not None

    page.goto(f"{signed_in}/console/runs/{terminated}", wait_until="load")
    page.fill('#form-terminate input[name="reason"]', "stop")
    _submit(page, "#form-terminate")
    assert harvest.describe(terminated).status == "TERMINATED"
    assert page.locator("header .badge").first.get_attribute("data-status") == "TERMINATED"
    _shot(page, tmp_path / "run-terminated.png")
    # a second terminate of a sealed run: the refusal is a page, with the API's status
    assert page.locator("#form-terminate").count() == 0
    page.close()
    harvest.cancel_workflow_execution(requested)


def test_erase_needs_the_run_id_typed_and_reset_forks(harvest, workers, tag, signed_in, browser, tmp_path):
    run_id = harvest.start_workflow("approval", {"tag": tag, "secret": "pan-4111"})
    harvest.signal(run_id, "decision", "ok")
    harvest.result(run_id, timeout=30)
    page = _open(browser, f"{signed_in}/console/runs/{run_id}")
    assert "pan-4111" in (page.locator("#run-input").text_content() or "")
    page.fill('#form-erase input[name="confirm"]', run_id[:-1])
    with page.expect_navigation():
        page.click("#form-erase button[type=submit]")
    assert "type the run id exactly" in (page.locator("#error").text_content() or "")
    assert harvest.describe(run_id).erased_at is None
    page.goto(f"{signed_in}/console/runs/{run_id}", wait_until="load")
    page.fill('#form-erase input[name="confirm"]', run_id)
    _submit(page, "#form-erase")
    assert page.locator("#flash").text_content() == "Payloads erased."
    assert page.locator("#run-erased").count() == 1 and harvest.describe(run_id).erased_at is not None
    assert "pan-4111" not in page.content()
    _shot(page, tmp_path / "run-erased.png")

    live = harvest.start_workflow("approval", {"tag": tag})
    _settled(harvest, live)
    page.goto(f"{signed_in}/console/runs/{live}", wait_until="load")
    page.fill('#form-reset input[name="to_seq"]', "1")
    _submit(page, "#form-reset")
    forked = harvest.describe(live).forked_to
    assert forked and page.locator("#run-id").text_content() == forked
    assert page.locator("#forked-from").text_content() == live
    harvest.cancel_workflow_execution(forked)
    _settled(harvest, forked)
    # the fork holds copies of the source's payloads: erasing the source alone is refused
    page.goto(f"{signed_in}/console/runs/{live}", wait_until="load")
    page.fill('#form-erase input[name="confirm"]', live)
    _submit(page, "#form-erase")
    assert f"{forked!r} hold copies" in (page.locator("#error").text_content() or "")
    assert harvest.describe(live).erased_at is None and harvest.describe(forked).erased_at is None
    page.goto(f"{signed_in}/console/runs/{live}", wait_until="load")
    page.fill('#form-erase input[name="confirm"]', live)
    page.check('#form-erase input[name="with_forks"]')
    _submit(page, "#form-erase")
    assert page.locator("#flash").text_content() == "Payloads erased."
    assert harvest.describe(live).erased_at is not None and harvest.describe(forked).erased_at is not None
    page.close()


def test_a_run_page_links_its_parent_children_and_chain(harvest, workers, tag, signed_in, browser, tmp_path):
    parent = f"links-{tag}"
    harvest.start_workflow("ch_checkout", {"tag": tag}, execution_id=parent)
    harvest.result(parent, timeout=60)
    page = _open(browser, f"{signed_in}/console/runs/{parent}")
    assert page.locator("#children a.child").all_text_contents() == [f"{parent}-c1"]
    assert "COMPLETED" in (page.locator("#children").text_content() or "")
    with page.expect_navigation():
        page.click("#children a.child")
    assert page.locator("#run-id").text_content() == f"{parent}-c1"
    assert page.locator("#parent").text_content() == parent  # and back up
    _shot(page, tmp_path / "run-child.png")
    first = f"links-chain-{tag}"
    harvest.start_workflow("ch_counter", {"n": 0, "to": 1, "every": 1}, execution_id=first)
    harvest.result(first, timeout=60)
    second = harvest.describe(first).continued_to
    page.goto(f"{signed_in}/console/runs/{first}", wait_until="load")
    assert page.locator("#continued-from").count() == 0
    with page.expect_navigation():
        page.click("#continued-to")
    assert page.locator("#run-id").text_content() == second
    assert page.locator("#continued-from").text_content() == first
    assert page.locator("#continued-to").count() == 0  # the chain's last link
    _shot(page, tmp_path / "run-chain.png")
    page.close()


def test_an_open_run_page_refreshes_itself(harvest, workers, tag, signed_in, browser):
    run_id = harvest.start_workflow("approval", {"tag": tag})
    _settled(harvest, run_id)
    page = _open(browser, f"{signed_in}/console/runs/{run_id}")
    from playwright.sync_api import expect  # browser.py says so if playwright is missing

    # expect() polls from Playwright's own world: a wait_for_function string is eval'd in the page
    # once its first check fails, which the console's CSP (script-src 'self') refuses
    expect(page.locator("#live")).to_have_text(re.compile(r"^live ·"), timeout=20_000)
    harvest.signal(run_id, "decision", "later")
    harvest.result(run_id, timeout=30)
    page.wait_for_selector('header .badge[data-status="COMPLETED"]', timeout=20_000)
    assert page.locator("body").get_attribute("data-live") is None
    page.close()


# ── docs, sign-out and cross-site ────────────────────────────────────────────────────────────
def test_the_api_docs_work_offline(signed_in, browser, tmp_path):
    page = _open(browser, f"{signed_in}/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=20_000)
    assert "harvest-celery operator API" in (page.locator(".swagger-ui .info .title").text_content() or "")
    page.wait_for_selector('.opblock-summary-path[data-path="/workflows"]')
    _shot(page, tmp_path / "docs.png")
    _same_origin_only(page, signed_in)
    page.close()


class _Evil(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = (
            f'<html><body><form id="f" method="post" action="{self.target}">'
            '<input name="reason" value="pwned"></form>'
            '<script>document.getElementById("f").submit()</script></body></html>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("path", ["/console/runs/{id}/terminate", "/workflows/{id}/terminate"])
def test_a_cross_site_form_post_from_another_site_changes_nothing(
    harvest, workers, tag, signed_in, browser, path
):
    run_id = harvest.start_workflow("approval", {"tag": tag})
    _settled(harvest, run_id)
    handler = type("Evil", (_Evil,), {"target": signed_in + path.format(id=run_id)})
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()  # signed in: the browser holds the console's session cookie
        with page.expect_response(lambda r: r.request.method == "POST") as posted:
            page.goto(f"http://localhost:{evil.server_address[1]}/", wait_until="load")
        assert posted.value.status == 403
        page.wait_for_load_state("load")
        assert "CrossSiteRequest" in page.content()
        page.close()
    finally:
        evil.shutdown()
    time.sleep(0.5)
    x = harvest.describe(run_id)
    assert (x.status, x.cancel_reason) == ("RUNNING", None)
    harvest.cancel_workflow_execution(run_id)


def test_signing_out_ends_the_session(server, browser):
    page = _open(browser, f"{server}/console")
    with page.expect_navigation():
        page.click("form.signout button")
    assert urlparse(page.url).path == "/console/login"
    page.goto(f"{server}/console", wait_until="load")
    assert urlparse(page.url).path == "/console/login"
    page.fill("#token", TOKEN)  # sign in again for any test that runs after
    with page.expect_navigation():
        page.click("form#login button")
    assert re.fullmatch(r"/console", urlparse(page.url).path)
    page.close()
