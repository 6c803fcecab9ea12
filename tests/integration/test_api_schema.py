"""Property-based run of the operator API against its own OpenAPI schema (schemathesis), on the
test app's Harvest over real Postgres: no generated request may produce a server error, and every
response must match the documented status codes, content types and schemas."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from harvest_celery._web.api import create_app

pytestmark = pytest.mark.integration

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_no_request_breaks_the_api(harvest, monkeypatch):
    """Every operation, 50 generated requests each (schemathesis strategies driven by hypothesis
    directly, so the run does not depend on schemathesis's pytest plugin)."""
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(harvest))
    # /admin/purge deletes every finished run older than a generated age: tested on its own, never
    # fuzzed against the shared session database
    operations = [
        op for op in (result.ok() for result in schema.get_all_operations()) if op.path != "/admin/purge"
    ]
    assert len(operations) >= 15
    for operation in operations:

        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def check(case):
            case.call_and_validate(checks=CHECKS)

        check()


@pytest.mark.parametrize("token", ["s3cret"])
def test_the_schema_declares_bearer_auth_when_a_token_is_configured(harvest, token):
    from fastapi.testclient import TestClient

    client = TestClient(create_app(harvest, token=token))
    assert client.get("/openapi.json").status_code == 401  # the document needs the token too
    spec = client.get("/openapi.json", headers={"Authorization": f"Bearer {token}"}).json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert spec["paths"]["/workflows"]["post"]["security"] == [{"HTTPBearer": []}]
    assert spec["paths"]["/workflows"]["get"]["security"] == [{"HTTPBearer": []}]  # reads too
    assert "security" not in spec["paths"]["/healthz"]["get"]
