"""A shop's views: the order row and the run commit or roll back together."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from harvest_celery.contrib.django import harvest
from tests.integration.django.shop.models import Order


def place_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(tag=body["tag"], total=body["total"])
        run_id = harvest.start_workflow(
            "dj_checkout",
            {"order_id": order.pk, "tag": body["tag"], "note": body.get("note", "")},
            execution_id=f"order-{body['tag']}",
        )
        if body.get("fail"):
            raise RuntimeError("the view failed after starting the workflow")
    return JsonResponse({"run_id": run_id, "order_id": order.pk}, status=202)


def open_gate(request: HttpRequest, tag: str) -> JsonResponse:
    return JsonResponse(
        {"run_id": harvest.start_workflow("dj_gate", {"tag": tag}, execution_id=f"gate-{tag}")}, status=202
    )


def cancel_run(request: HttpRequest, run_id: str) -> JsonResponse:
    return JsonResponse({"status": harvest.cancel_workflow_execution(run_id, reason="customer asked")})
