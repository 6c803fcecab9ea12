"""Found by autodiscovery. The activity runs in the Django worker and uses the ORM."""

from __future__ import annotations

import json
import os

import redis

from harvest_celery import activity

_r = redis.Redis.from_url(os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5"))


def effects(tag: str) -> list[dict]:
    return [json.loads(x) for x in _r.lrange(f"dj:{tag}", 0, -1)]


@activity(queue="dj_q")
def dj_charge(order: dict) -> str:
    from tests.integration.django.shop.models import Order

    Order.objects.filter(pk=order["order_id"]).update(status="paid")
    _r.rpush(f"dj:{order['tag']}", json.dumps({"name": "dj_charge", "order_id": order["order_id"]}))
    return f"charged:{order['tag']}"


@activity(queue="dj_q")
def dj_step(data: dict) -> str:
    return "stepped"
