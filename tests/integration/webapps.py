"""A Flask shop on the harvest Postgres database, with its own Celery app, as a user has it:
Flask-SQLAlchemy for its orders, ``FlaskHarvest`` for its workflows, starts inside
``db.session``'s transaction. The worker for it runs ``celery -A tests.integration.webapps:celery``
(queues ``wa_decide`` and ``wa_q``); the transactional-start and async tests use its ``harvest``.

The lost-message pass is set to a minute (``redispatch_after=60``), so a run that completes within
seconds proves its first decision was dispatched on commit (the after-commit hook, or the decision
worker hearing the announcement), not by the sweeper's fallback.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery
from flask import Blueprint, Flask, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.engine import make_url

from harvest_celery import (
    PostgresPayloadStore,
    WorkflowContext,
    activity,
    configure_dedicated_celery_app,
    workflow,
)
from harvest_celery._store.records import Timings
from harvest_celery.contrib.flask import FlaskHarvest

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_it"
)
BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker
DECISION_QUEUE = "wa_decide"
QUEUE = "wa_q"
OFFLOAD = 200  # an order with a note longer than this is offloaded to harvest_blobs

celery = Celery("webapps", broker=BROKER_URL)
configure_dedicated_celery_app(celery)
_r = redis.Redis.from_url(REDIS_URL)


def effects(tag: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in _r.lrange(f"wa:{tag}", 0, -1)]


@activity(queue=QUEUE)
def wa_charge(order: dict) -> str:
    _r.rpush(f"wa:{order['tag']}", json.dumps({"name": "wa_charge", "order": order}))
    return f"charged:{order['tag']}"


@activity(queue=QUEUE)
def wa_wait_step(data: dict) -> str:
    return "stepped"


@workflow
async def wa_checkout(ctx: WorkflowContext, order: dict) -> str:
    return await ctx.execute_activity(wa_charge, order)  # type: ignore[no-any-return]


@workflow
async def wa_gate(ctx: WorkflowContext, data: dict) -> str:
    """Waits for a signal, so a test can cancel it while it runs."""
    await ctx.execute_activity(wa_wait_step, data)
    return str(await ctx.wait_signal("go"))


db = SQLAlchemy()
harvest = FlaskHarvest(db=db, celery_app=celery)
bp = Blueprint("shop", __name__)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "wa_orders"
    id = db.Column(db.Integer, primary_key=True)
    tag = db.Column(db.String(64), nullable=False)
    total = db.Column(db.Integer, nullable=False)


@bp.post("/orders")
def place_order() -> Any:
    body = request.get_json()
    order = Order(tag=body["tag"], total=body["total"])
    db.session.add(order)
    db.session.flush()
    run_id = harvest.start_workflow(
        "wa_checkout",
        {"tag": body["tag"], "total": body["total"], "note": body.get("note", "")},
        execution_id=f"order-{body['tag']}",
    )
    if body.get("fail"):
        raise RuntimeError("the view failed after starting the workflow")
    db.session.commit()
    return jsonify(run_id=run_id, order_id=order.id), 202


@bp.post("/gates/<tag>")
def open_gate(tag: str) -> Any:
    run_id = harvest.start_workflow("wa_gate", {"tag": tag}, execution_id=f"gate-{tag}")
    db.session.commit()
    return jsonify(run_id=run_id), 202


@bp.post("/runs/<run_id>/cancel")
def cancel(run_id: str) -> Any:
    return jsonify(status=harvest.cancel_workflow_execution(run_id, reason="customer asked"))


def create_app(driver: str = "psycopg2") -> Flask:
    """The shop on the harvest database through ``driver`` (psycopg2 or psycopg, i.e. 3)."""
    app = Flask("webapps")
    uri = make_url(DATABASE_URL).set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)
    app.config.update(
        SQLALCHEMY_DATABASE_URI=uri,
        HARVEST_DECISION_QUEUE=DECISION_QUEUE,
        HARVEST_MODULES=["tests.integration.webapps"],
        HARVEST_OPTIONS={
            "timings": Timings(redispatch_after=60.0, default_lease=30.0),
            "sweep_interval": 0.3,
            "payload_store": PostgresPayloadStore(),
            "offload_threshold": OFFLOAD,
        },
    )
    db.init_app(app)
    harvest.init_app(app)
    app.register_blueprint(bp)
    return app


app = create_app()  # the worker's: importing this module registers the tasks on `celery`
