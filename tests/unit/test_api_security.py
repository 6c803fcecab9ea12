"""The operator API's auth, CSRF and hardening, over an embedded (SQLite) Harvest: every endpoint
but /healthz needs the token (reads included), the console's session cookie and CSRF token, a
cross-site form post that changes nothing, the request-size and JSON-depth limits, ids with '/',
a database that does not answer (503 JSON everywhere), and never a plain-text error body."""

from __future__ import annotations

import re
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, activity, workflow
from harvest_celery._core.jsonvalues import MAX_JSON_DEPTH, check_json, check_storable
from harvest_celery._errors import PayloadNotSerializable
from harvest_celery._web.api import create_app
from harvest_celery._web.auth import SESSION_COOKIE
from harvest_celery._web.hardening import json_too_deep

TOKEN = "s3cret-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "pan-4111-1111"


@activity(retry=RetryPolicy(max_attempts=1))
def explode(data: dict) -> dict:
    raise ValueError("<script>alert('x')</script>")


@activity(retry=RetryPolicy(max_attempts=1))
def deep_output(levels: int) -> list:
    out: list = []
    cursor = out
    for _ in range(levels):
        cursor.append([])
        cursor = cursor[0]
    return out


@workflow(name="deep_activity")
async def deep_activity(ctx: WorkflowContext, levels: int) -> list:
    return await ctx.execute_activity(deep_output, levels)  # type: ignore[no-any-return]


@workflow(name="waiter")
async def waiter(ctx: WorkflowContext, data: dict) -> str:
    return await ctx.wait_signal("go")  # type: ignore[no-any-return]


@workflow(name="exploder")
async def exploder(ctx: WorkflowContext, data: dict) -> dict:
    return await ctx.execute_activity(explode, data)  # type: ignore[no-any-return]


@pytest.fixture
def harvest(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    monkeypatch.delenv("HARVEST_API_MAX_BODY_BYTES", raising=False)
    h = Harvest(f"sqlite:///{tmp_path / 'sec.db'}").register(
        explode, waiter, exploder, deep_output, deep_activity
    )
    h.migrate()
    return h


@pytest.fixture
def client(harvest):
    return TestClient(create_app(harvest, token=TOKEN), raise_server_exceptions=False)


def _json_error(resp, status: int, error: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) >= {"error", "detail"}
    if error is not None:
        assert body["error"] == error, body
    return body


def _sign_in(client: TestClient) -> str:
    """Sign in through the form; the CSRF token of the session, read from a page's form."""
    resp = client.post("/console/login", data={"token": TOKEN, "next": "/console"}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/console"
    page = client.get("/console").text
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', page).group(1)


# ── authentication ───────────────────────────────────────────────────────────────────────────
def test_every_endpoint_but_healthz_needs_the_token_reads_included(harvest, client):
    run_id = harvest.start_workflow("waiter", {"card": SECRET})
    for path in (
        "/workflows",
        f"/workflows/{run_id}",
        f"/workflows/{run_id}/history",
        "/metrics",
        "/openapi.json",
        "/dags/d/runs/x",
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            body = _json_error(client.get(path, headers=headers), 401, "Unauthorized")
            assert SECRET not in str(body)
    assert SECRET in client.get(f"/workflows/{run_id}/history", headers=BEARER).text
    # a query reads the run's state: it needs the token like every read
    _json_error(client.post(f"/workflows/{run_id}/queries/stage"), 401, "Unauthorized")
    _json_error(client.post(f"/workflows/{run_id}/updates/qty"), 401, "Unauthorized")  # a mutation
    assert client.get("/healthz").json() == {"status": "ok"}
    # HTML pages send the browser to the sign-in page instead
    for path in ("/console", f"/console/runs/{run_id}", "/docs", "/ui/dags/d/runs/x"):
        resp = client.get(path, follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"].startswith("/console/login?next=")
        assert SECRET not in resp.text


def test_the_openapi_document_declares_the_bearer_scheme_on_reads_too(client):
    spec = client.get("/openapi.json", headers=BEARER).json()
    assert spec["paths"]["/workflows"]["get"]["security"] == [{"HTTPBearer": []}]
    assert spec["paths"]["/workflows"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "401" in spec["paths"]["/workflows/{execution_id}/history"]["get"]["responses"]
    assert "security" not in spec["paths"]["/healthz"]["get"]
    assert not [p for p in spec["paths"] if p.startswith("/console")]


def test_signing_in_sets_a_strict_httponly_signed_session(harvest, client):
    wrong = client.post("/console/login", data={"token": "nope", "next": "/console"})
    assert wrong.status_code == 401 and "not the token" in wrong.text
    assert SESSION_COOKIE not in client.cookies
    resp = client.post(
        "/console/login", data={"token": TOKEN, "next": "https://evil.example/"}, follow_redirects=False
    )
    assert resp.headers["location"] == "/console"  # never an open redirect
    cookie = resp.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert client.get("/workflows").status_code == 200  # the session reads the API too
    issued, nonce, mac = client.cookies[SESSION_COOKIE].split(".")
    forged = TestClient(client.app, cookies={SESSION_COOKIE: f"{int(issued) + 1}.{nonce}.{mac}"})
    assert forged.get("/workflows").status_code == 401
    other = TestClient(
        create_app(harvest, token="another-token"),  # a rotated token ends sessions
        cookies={SESSION_COOKIE: client.cookies[SESSION_COOKIE]},
    )
    assert other.get("/workflows").status_code == 401


def test_an_expired_session_is_refused(harvest, client, monkeypatch):
    _sign_in(client)
    later = time.time() + 13 * 3600
    monkeypatch.setattr(time, "time", lambda: later)
    assert client.get("/workflows").status_code == 401


# ── CSRF ─────────────────────────────────────────────────────────────────────────────────────
def test_a_session_mutation_needs_its_csrf_token(harvest, client):
    run_id = harvest.start_workflow("waiter", {})
    csrf = _sign_in(client)
    # the JSON API with the cookie: the header is needed
    _json_error(client.post(f"/workflows/{run_id}/pause"), 403, "CsrfRefused")
    _json_error(client.post(f"/workflows/{run_id}/pause", headers={"X-CSRF-Token": "0" * 64}), 403)
    assert harvest.describe(run_id).paused_at is None
    assert client.post(f"/workflows/{run_id}/pause", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert harvest.describe(run_id).paused_at is not None
    # a console form without the token (or with another session's) changes nothing
    for form in ({}, {"csrf_token": "f" * 64}):
        resp = client.post(f"/console/runs/{run_id}/resume", data=form, follow_redirects=False)
        assert resp.status_code == 403 and "nothing was changed" in resp.text
        assert harvest.describe(run_id).paused_at is not None
    resp = client.post(f"/console/runs/{run_id}/resume", data={"csrf_token": csrf}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].endswith("?done=resume")
    assert harvest.describe(run_id).paused_at is None


@pytest.mark.parametrize("with_token", [True, False])
def test_a_cross_site_form_post_changes_nothing(harvest, with_token, monkeypatch):
    client = TestClient(create_app(harvest, token=TOKEN if with_token else None))
    csrf = _sign_in(client) if with_token else ""
    run_id = harvest.start_workflow("waiter", {})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    attempts = [
        # a foreign page's <form method=post> (the browser names its origin)
        (f"/workflows/{run_id}/terminate", {**form, "Origin": "https://evil.example"}),
        (f"/workflows/{run_id}/pause", {**form, "Sec-Fetch-Site": "cross-site"}),
        (f"/console/runs/{run_id}/terminate", {**form, "Origin": "https://evil.example"}),
        (f"/console/runs/{run_id}/cancel", {**form, "Origin": "null"}),
        # an old browser that names no origin: still no CSRF token, or a form body on the API
        (f"/workflows/{run_id}/cancel", form),
        (f"/console/runs/{run_id}/terminate", form),
        (f"/workflows/{run_id}/pause", {"Content-Type": "text/plain"}),
    ]
    for path, headers in attempts:
        resp = client.post(
            path,
            content=f"reason=x&csrf_token={'' if 'Origin' in headers else 'bad'}",
            headers=headers,
            follow_redirects=False,
        )
        assert resp.status_code in (401, 403), (path, headers, resp.status_code, resp.text)
    x = harvest.describe(run_id)
    assert (x.status, x.paused_at, x.cancelled_at) == ("RUNNING", None, None)
    # the same origin, with the session's token, is let in
    ok = client.post(
        f"/console/runs/{run_id}/pause",
        data={"csrf_token": csrf or _csrf_open(client, run_id)},
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert ok.status_code == 303, ok.text
    assert harvest.describe(run_id).paused_at is not None


def _csrf_open(client: TestClient, run_id: str) -> str:
    page = client.get(f"/console/runs/{run_id}").text  # open mode issues a session with the page
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', page).group(1)


def test_the_bearer_token_needs_no_csrf_token(harvest, client):
    run_id = harvest.start_workflow("waiter", {})
    assert client.post(f"/workflows/{run_id}/pause", headers=BEARER).status_code == 200


# ── limits ───────────────────────────────────────────────────────────────────────────────────
def test_an_oversized_body_is_413_json_by_length_and_when_streamed(harvest):
    client = TestClient(create_app(harvest, token=TOKEN, max_body_bytes=64 * 1024))
    big = {"workflow": "waiter", "input": {"blob": "x" * 100_000}}
    _json_error(client.post("/workflows", json=big, headers=BEARER), 413, "RequestTooLarge")

    def chunks():
        yield b'{"workflow": "waiter", "input": "'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"}'

    streamed = client.post(
        "/workflows", content=chunks(), headers={**BEARER, "Content-Type": "application/json"}
    )
    _json_error(streamed, 413, "RequestTooLarge")
    assert harvest.list() == []
    small = client.post(
        "/workflows", json={"workflow": "waiter", "input": {"blob": "x" * 1000}}, headers=BEARER
    )
    assert small.status_code == 201


def test_the_default_limit_is_4_mib_and_the_env_sets_another(harvest, monkeypatch):
    client = TestClient(create_app(harvest, token=TOKEN))
    assert (
        client.post(
            "/workflows",
            content=b"x" * (4 * 1024 * 1024 + 1),
            headers={**BEARER, "Content-Type": "application/json"},
        ).status_code
        == 413
    )
    monkeypatch.setenv("HARVEST_API_MAX_BODY_BYTES", "2048")
    client = TestClient(create_app(harvest, token=TOKEN))
    assert (
        client.post(
            "/workflows", json={"workflow": "waiter", "input": "z" * 3000}, headers=BEARER
        ).status_code
        == 413
    )


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 490, 600, 5000, 100_000])
def test_deep_json_is_a_clear_422_at_start_and_signal(harvest, client, depth):
    run_id = harvest.start_workflow("waiter", {})
    nested = "[" * depth + "]" * depth
    for path, text in (
        ("/workflows", f'{{"workflow": "waiter", "input": {nested}}}'),
        ("/workflows", f'{{"workflow": "waiter", "extra": {nested}}}'),
        (f"/workflows/{run_id}/signals/go", f'{{"payload": {nested}}}'),
    ):
        resp = client.post(path, content=text, headers={**BEARER, "Content-Type": "application/json"})
        body = _json_error(resp, 422, "ValidationError")
        assert "nested more than 100 levels deep" in str(body["detail"])
    assert [x.id for x in harvest.list()] == [run_id]
    assert [h.event.type for h in harvest.history(run_id)] == ["WorkflowStarted"]


def test_json_at_the_depth_limit_is_accepted(client):
    nested = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)  # input sits one level down
    resp = client.post(
        "/workflows",
        content=f'{{"workflow": "waiter", "input": {nested}}}',
        headers={**BEARER, "Content-Type": "application/json"},
    )
    assert resp.status_code == 201, resp.text


def test_the_depth_checks_of_the_pure_edge():
    ok: list = []
    deep: list = []
    for target, levels in ((ok, MAX_JSON_DEPTH - 1), (deep, 600)):
        cursor = target
        for _ in range(levels):
            cursor.append([])
            cursor = cursor[0]
    assert check_json(ok, "x") == ok and check_storable(ok, "x") is ok
    for check in (check_json, check_storable):
        with pytest.raises(PayloadNotSerializable, match="nested more than 100 levels deep"):
            check(deep, "an activity output")
    assert not json_too_deep(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}')
    assert json_too_deep(b"[" * 101 + b"]" * 101) and not json_too_deep(b"[" * 100 + b"]" * 100)
    wide = [{"a": [1, {"b": []}]} for _ in range(5000)]  # many containers, shallow: accepted
    assert check_json(wide, "x") == wide


def test_deep_json_is_refused_by_the_client_and_fails_an_activity_cleanly(harvest):
    deep: list = []
    cursor = deep
    for _ in range(600):
        cursor.append([])
        cursor = cursor[0]
    with pytest.raises(PayloadNotSerializable, match="nested more than 100"):
        harvest.start_workflow("waiter", deep)
    assert harvest.list() == []
    run_id = harvest.start_workflow("waiter", {})
    with pytest.raises(PayloadNotSerializable, match="nested more than 100"):
        harvest.signal(run_id, "go", deep)
    assert [h.event.type for h in harvest.history(run_id)] == ["WorkflowStarted"]
    # an activity output nested 600 deep fails its attempt at once (it used to time out)
    failed = harvest.start_workflow("deep_activity", 600)
    assert harvest.describe(failed).status == "FAILED"
    errors = harvest.store.attempt_errors(failed)
    assert [(e.activity_id != "", e.error_type) for e in errors][0] == (True, "PayloadNotSerializable")
    assert harvest.start_workflow("deep_activity", 50) and harvest.list(status="COMPLETED")


def test_an_id_with_a_slash_is_refused_at_start(harvest, client):
    for bad in ("a/b", "a:b", "x\x01"):
        body = _json_error(
            client.post("/workflows", json={"workflow": "waiter", "execution_id": bad}, headers=BEARER),
            400,
            "InvalidExecutionId",
        )
        assert "may not hold" in body["detail"]
    assert harvest.list() == []


# ── failures ─────────────────────────────────────────────────────────────────────────────────
def test_healthz_names_no_database_host_or_port(monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    down = Harvest("postgresql+psycopg2://postgres@127.0.0.1:1/harvest_nowhere")
    body = _json_error(TestClient(create_app(down)).get("/healthz"), 503, "DatabaseUnavailable")
    assert "127.0.0.1" not in str(body) and ":1" not in str(body) and "nowhere" not in str(body)


def test_every_endpoint_answers_503_json_when_the_database_is_down(monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    down = Harvest("postgresql+psycopg2://postgres@127.0.0.1:1/harvest_nowhere").register(
        explode, waiter, exploder
    )
    client = TestClient(create_app(down, token=TOKEN), raise_server_exceptions=False, headers=BEARER)
    calls = [
        ("get", "/workflows", None),
        ("get", "/workflows/r1", None),
        ("get", "/workflows/r1/history", None),
        ("post", "/workflows", {"workflow": "waiter"}),
        ("post", "/workflows/r1/signals/go", {"payload": 1}),
        ("post", "/workflows/r1/cancel", None),
        ("post", "/workflows/r1/request-cancel", None),
        ("post", "/workflows/r1/terminate", None),
        ("post", "/workflows/r1/pause", None),
        ("post", "/workflows/r1/resume", None),
        ("post", "/workflows/r1/reset", {"to_seq": 1}),
        ("post", "/workflows/r1/erase-payloads", None),
        ("post", "/workflows/r1/queries/stage", None),
        ("post", "/workflows/r1/updates/qty", {"arg": 1}),
        ("post", "/admin/purge", {"older_than_days": 1}),
        ("get", "/healthz", None),
    ]
    for method, path, body in calls:
        resp = client.request(method, path, json=body)
        payload = _json_error(resp, 503, "DatabaseUnavailable")
        assert "127.0.0.1" not in str(payload), (path, payload)
    page = client.get("/console/runs/r1")
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")


def test_an_unexpected_error_is_a_json_500_without_internals(harvest, client, monkeypatch):
    def broken(**_kw):
        raise RuntimeError("internal detail at /srv/secret/path")

    monkeypatch.setattr(harvest, "list", broken)
    body = _json_error(client.get("/workflows", headers=BEARER), 500, "InternalServerError")
    assert "secret" not in str(body)
    assert client.get("/nope", headers=BEARER).headers["content-type"].startswith("application/json")
    _json_error(client.delete("/workflows", headers=BEARER), 405)


def test_the_list_reads_no_payload_column(harvest, client):
    harvest.start_workflow("waiter", {"card": SECRET})
    statements: list[str] = []
    engine = harvest.store.engine
    listen = lambda conn, cursor, statement, *a: statements.append(statement)  # noqa: E731
    sa.event.listen(engine, "before_cursor_execute", listen)
    try:
        resp = client.get("/workflows", headers=BEARER)
    finally:
        sa.event.remove(engine, "before_cursor_execute", listen)
    assert resp.status_code == 200 and SECRET not in resp.text
    selects = [s for s in statements if "harvest_executions" in s]
    assert selects
    for statement in selects:
        columns = statement.split("FROM")[0]
        assert not re.search(r"\.(input|result)\b", columns), statement


# ── the console, served by the app (the browser tests are tests/integration/test_console.py) ──
def test_console_pages_escape_what_users_control(harvest, client):
    _sign_in(client)
    run_id = harvest.start_workflow("exploder", {"note": "<img src=x onerror=alert(1)>"})
    assert harvest.describe(run_id).status == "FAILED"
    page = client.get(f"/console/runs/{run_id}")
    assert page.status_code == 200
    assert "<script>alert" not in page.text and "<img src=x" not in page.text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    listing = client.get("/console?status=FAILED&workflow=exploder")
    assert run_id in listing.text and "<img src=x" not in listing.text
    assert client.get("/console?status=NOPE").status_code == 400


def test_open_mode_console_issues_a_session_and_needs_no_sign_in(harvest):
    client = TestClient(create_app(harvest))
    page = client.get("/console")
    assert page.status_code == 200 and SESSION_COOKIE in client.cookies
    assert client.get("/console/login", follow_redirects=False).status_code == 303
