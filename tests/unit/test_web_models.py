"""The operator API's pydantic models against the errors they describe: every reason a
``RetryRefused`` can carry is one the published ``RetryRefusedBody`` (the 409 of a DAG retry)
accepts."""

from __future__ import annotations

import ast
import pathlib
import typing

import pydantic
import pytest

import harvest_celery
from harvest_celery._errors import RetryRefused
from harvest_celery._web.models import RetryRefusalReason, RetryRefusedBody

PACKAGE = pathlib.Path(harvest_celery.__file__).parent


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def raised_reasons() -> dict[str, str]:
    """The reason of every ``RetryRefused(...)`` the package constructs → where (file:line)."""
    reasons: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not (isinstance(node, ast.Call) and _called_name(node.func) == "RetryRefused"):
                continue
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            reason = (
                node.args[1]
                if len(node.args) > 1
                else next((k.value for k in node.keywords if k.arg == "reason"), None)
            )
            assert isinstance(reason, ast.Constant) and isinstance(reason.value, str), (
                f"{where}: a RetryRefused reason that is not a string literal cannot be checked "
                "against the API model"
            )
            reasons.setdefault(reason.value, where)
    return reasons


def documented_reasons() -> set[str]:
    """The reasons ``RetryRefused``'s docstring declares (``reason``: a · b · c.)."""
    doc = RetryRefused.__doc__ or ""
    assert "``reason``:" in doc, "RetryRefused's docstring no longer lists its reasons"
    return {part.strip().rstrip(".").strip() for part in doc.split("``reason``:", 1)[1].split("·")}


def test_the_source_scan_finds_the_raisers():
    assert raised_reasons(), "no RetryRefused(...) found in the package: the scan is broken"


@pytest.mark.parametrize("reason", sorted({*raised_reasons(), *documented_reasons()}))
def test_the_retry_refused_body_accepts_every_reason_retry_refused_carries(reason):
    assert reason in typing.get_args(RetryRefusalReason), (
        f"RetryRefused reason {reason!r} ({raised_reasons().get(reason, 'documented')}) is missing "
        "from harvest_celery._web.models.RetryRefusalReason"
    )
    body = RetryRefusedBody.model_validate({"error": "RetryRefused", "detail": "refused", "reason": reason})
    assert body.reason == reason


def test_the_retry_refused_body_still_refuses_an_unknown_reason():
    with pytest.raises(pydantic.ValidationError):
        RetryRefusedBody.model_validate({"error": "RetryRefused", "detail": "refused", "reason": "bogus"})
