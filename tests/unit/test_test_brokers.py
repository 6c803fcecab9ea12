"""The integration suite's broker selection (tests/integration/brokers.py): the broker variable
names the broker only, the suite's Redis is never an amqp:// URL, each run's vhost is its own,
and the worker banner's transport line is what the RabbitMQ leg checks."""

from __future__ import annotations

from tests.integration import brokers

SLOT_REDIS = "redis://127.0.0.1:6379/10"
RABBIT = "amqp://guest:guest@127.0.0.1:5672"


def test_the_rabbitmq_leg_takes_precedence_and_keeps_the_slots_redis_for_effects() -> None:
    env = {"HARVEST_TEST_BROKER": SLOT_REDIS, "HARVEST_TEST_RABBITMQ": RABBIT}
    assert brokers.broker(env) == RABBIT
    assert brokers.redis_url(env) == SLOT_REDIS


def test_an_amqp_broker_never_becomes_the_suites_redis() -> None:
    assert brokers.redis_url({"HARVEST_TEST_BROKER": RABBIT}) == brokers.DEFAULT_REDIS
    assert brokers.redis_url({"HARVEST_TEST_REDIS": "redis://127.0.0.1:6379/3"}) == "redis://127.0.0.1:6379/3"
    assert brokers.redis_url({}) == brokers.DEFAULT_REDIS == brokers.broker({})


def test_each_run_has_a_vhost_of_its_own() -> None:
    assert brokers.vhost_name("harvest_it_s1") != brokers.vhost_name("harvest_it_s2")
    assert brokers.vhost_name("harvest_it_s1", "_sticky") == "harvest_it_s1_sticky"
    assert brokers.with_vhost(RABBIT, "harvest_it_s1") == f"{RABBIT}/harvest_it_s1"
    assert brokers.with_vhost(f"{RABBIT}/other", "v") == f"{RABBIT}/v"


def test_the_banners_transport_line_is_read() -> None:
    banner = "- ** ---------- .> transport:   amqp://guest:**@127.0.0.1:5672/harvest_it_s1\n"
    assert brokers.transport_line(banner) == "amqp://guest:**@127.0.0.1:5672/harvest_it_s1"
    assert brokers.transport_line("no banner") is None
