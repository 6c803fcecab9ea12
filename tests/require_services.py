"""``HARVEST_REQUIRE_SERVICES=1`` (set by ``.ci/run``): a test skipped because Postgres, Redis,
RabbitMQ or PgBouncer is missing fails instead.

Developers may run the suite without every server (the test says which one it missed and is
skipped); CI must not pass that way. A skip counts as a missing service when its reason names
one of them (``missing`` below words it so); any other skip stays a skip.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import Any

import pytest

ENV = "HARVEST_REQUIRE_SERVICES"
SERVICES = re.compile(r"\b(postgres(?:ql)?|redis|rabbitmq|pgbouncer)\b", re.IGNORECASE)


def required() -> bool:
    return os.environ.get(ENV, "").strip() == "1"


def missing(service: str, detail: str) -> None:
    """Skip the running test because ``service`` is not available (under the switch: fail)."""
    reason = f"{service} is not available: {detail}"
    if required():
        pytest.fail(f"{reason} ({ENV}=1: a missing service fails the test)", pytrace=False)
    pytest.skip(reason)


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, Any]:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and required():
        reason = _reason(report)
        if SERVICES.search(reason):
            report.outcome = "failed"
            report.longrepr = f"skipped for a missing service, and {ENV}=1 makes that a failure: {reason}"
    return report
