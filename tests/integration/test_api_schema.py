"""Property-based run of the operator API against its own OpenAPI schema (schemathesis), on the
test app's Harvest over real Postgres: no generated request may produce a server error, and every
response must match the documented status codes, content types and schemas."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from harvest_celery._api import create_app

pytestmark = pytest.mark.integration

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@pytest.fixture
def api_schema(harvest, monkeypatch):
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(harvest))


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_breaks_the_api(case):
    case.call_and_validate(checks=CHECKS)


@pytest.mark.parametrize("token", ["s3cret"])
def test_the_schema_declares_bearer_auth_when_a_token_is_configured(harvest, token):
    from fastapi.testclient import TestClient

    spec = TestClient(create_app(harvest, token=token)).get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert spec["paths"]["/workflows"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in spec["paths"]["/workflows"]["get"]
