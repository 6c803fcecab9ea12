"""The integration suite's broker, and the Redis of its own that is never the broker.

``HARVEST_TEST_BROKER`` names the broker only: a Redis URL (the default leg) or an ``amqp://``
URL without a vhost; ``HARVEST_TEST_RABBITMQ=amqp://...`` (the RabbitMQ leg, ``scripts/test``)
takes precedence over it. On RabbitMQ each run gets a vhost of
its own, named after the run's database (``HARVEST_TEST_DB``: one per itrun slot, one for CI),
created before the first worker starts and deleted when the session ends (``rabbitmqctl``).

The effect recorder (``redis_client``), the apps' own Redis counters and the shop app's result
backend use a Redis of their own (``redis_url``), whichever broker runs.

``HARVEST_TEST_QUEUE_TYPE=quorum`` runs the test apps under quorum defaults
(``task_default_queue_type`` and ``task_create_missing_queue_type``), as a RabbitMQ team has them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from urllib.parse import urlsplit, urlunsplit

DEFAULT_REDIS = "redis://127.0.0.1:6379/5"


def is_amqp(url: str) -> bool:
    return url.split("://", 1)[0] in ("amqp", "pyamqp", "amqps")


def vhost_name(db_name: str, suffix: str = "") -> str:
    """The run's vhost: its database's name (unique per slot and per CI run), and ``suffix``
    for a test's vhost of its own."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{db_name}{suffix}")


def with_vhost(url: str, vhost: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{vhost}", "", ""))


def broker(environ: dict[str, str]) -> str:
    """The run's broker: ``HARVEST_TEST_RABBITMQ`` (the RabbitMQ leg; itrun sets
    ``HARVEST_TEST_BROKER`` to its slot's Redis, so the leg needs a variable of its own), else
    ``HARVEST_TEST_BROKER``, else Redis DB 5."""
    return environ.get("HARVEST_TEST_RABBITMQ") or environ.get("HARVEST_TEST_BROKER") or DEFAULT_REDIS


def redis_url(environ: dict[str, str]) -> str:
    """The suite's Redis: ``HARVEST_TEST_REDIS``, else ``HARVEST_TEST_BROKER`` when it is a Redis
    URL (the slot's Redis DB, also on the RabbitMQ leg), else Redis DB 5."""
    given = environ.get("HARVEST_TEST_REDIS") or environ.get("HARVEST_TEST_BROKER") or DEFAULT_REDIS
    return given if given.startswith("redis://") else DEFAULT_REDIS


def rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, check=check, timeout=60
    )


def rabbitmq_missing() -> str | None:
    """Why this machine's RabbitMQ cannot be used (None: it answers)."""
    if shutil.which("rabbitmqctl") is None:
        return "no rabbitmqctl on PATH"
    probe = rabbitmqctl("list_vhosts", check=False)
    if probe.returncode != 0:
        return f"rabbitmqctl list_vhosts exited {probe.returncode}: {probe.stderr.strip()[:200]}"
    return None


def server_version() -> tuple[int, ...]:
    out = rabbitmqctl("version").stdout.strip()
    return tuple(int(p) for p in re.findall(r"\d+", out)[:3])


def create_vhost(vhost: str, user: str = "guest") -> None:
    """A fresh vhost (a leftover of a killed run is deleted first), ``user`` allowed everything."""
    rabbitmqctl("delete_vhost", vhost, check=False)
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")


def delete_vhost(vhost: str) -> None:
    rabbitmqctl("delete_vhost", vhost, check=False)


def queues(vhost: str) -> dict[str, dict[str, str]]:
    """``rabbitmqctl list_queues``: each queue's type, durability and arguments, by name."""
    out = rabbitmqctl(
        "list_queues", "-p", vhost, "name", "type", "durable", "arguments", "--no-table-headers"
    )
    rows = {}
    for line in out.stdout.splitlines():
        cells = line.split("\t")
        if len(cells) >= 4:
            rows[cells[0]] = {"type": cells[1], "durable": cells[2], "arguments": cells[3]}
    return rows


def transport_line(log_text: str) -> str | None:
    """The ``.> transport:`` line of a worker's start banner (the broker it really connected to)."""
    found = re.findall(r"transport:\s+(\S+)", log_text)
    return found[-1] if found else None


def apply_queue_type(app: object) -> None:
    """``HARVEST_TEST_QUEUE_TYPE=quorum``: the app's queues are quorum queues."""
    import os

    apply_queue_type_to(app, os.environ.get("HARVEST_TEST_QUEUE_TYPE", "classic"))


def apply_queue_type_to(app: object, queue_type: str) -> None:
    """Quorum defaults as a team that runs quorum queues sets its app (the app's own
    configuration: harvest sets none of it)."""
    if queue_type == "quorum":
        app.conf.update(  # type: ignore[attr-defined]
            task_default_queue_type="quorum", task_create_missing_queue_type="quorum"
        )
