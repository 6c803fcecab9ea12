"""``harvest worker`` hands Celery's options to ``celery worker``: a real worker started with
``-n x@%h -E -c 2 -P threads`` answers as ``x@<host>`` and sends task events.

The worker consumes a queue only this test uses, so it never takes the shared workers' tasks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid
from typing import Any

from tests.integration.conftest import LOG_DIR, ROOT, wait_for
from tests.processes import stop_group


class _Events:
    """Every Celery event from one node, captured in a thread from the moment it starts."""

    def __init__(self, app: Any, hostname: str) -> None:
        self.hostname = hostname
        self.seen: list[dict[str, Any]] = []
        self._conn = app.connection_for_read()
        self._receiver = app.events.Receiver(self._conn, handlers={"*": self._on_event})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("hostname") == self.hostname:
            self.seen.append(event)

    def _run(self) -> None:
        try:
            self._receiver.capture(limit=None, timeout=None, wakeup=False)
        except Exception:  # noqa: BLE001 - the connection closes under it at stop()
            pass

    def types(self) -> set[str]:
        return {e["type"] for e in list(self.seen)}

    def __enter__(self) -> _Events:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(timeout=5)
        self._conn.release()


def test_harvest_worker_passes_celery_options_through(harvest: Any) -> None:
    app = harvest.celery_app
    queue = f"worker-cli-{uuid.uuid4().hex[:8]}"
    node = f"x@{socket.gethostname()}"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / "worker-cli.log"
    cmd = [
        sys.executable,
        "-m",
        "harvest_celery",
        "worker",
        "-A",
        "tests.integration.app:harvest",
        "-n",
        "x@%h",
        "-E",
        "-c",
        "2",
        "-P",
        "threads",
        "-Q",
        queue,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("HARVEST_METRICS_PORT", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        with _Events(app, node) as events:

            def ping() -> Any:
                assert proc.poll() is None, f"harvest worker exited ({proc.returncode}): see {log}"
                return app.control.inspect(destination=[node], timeout=1).ping()

            answer = wait_for(ping, timeout=30, interval=0.5, what=f"{node} to answer a ping")
            assert answer == {node: {"ok": "pong"}}

            stats = app.control.inspect(destination=[node], timeout=5).stats()[node]
            assert stats["pool"]["max-concurrency"] == 2  # -c 2
            assert "threads" in stats["pool"]  # -P threads: the thread pool's own stat
            active = app.control.inspect(destination=[node], timeout=5).active_queues()[node]
            # its -Q queue, plus its own sticky-routing queue (decisions for runs it holds warm)
            assert sorted(q["name"] for q in active) == sorted([queue, f"harvest@{node}"])

            # Our receiver hears the node (heartbeats are sent every 2 s), so it is bound; then a
            # task on the node's queue must raise task events, which only -E turns on.
            wait_for(
                lambda: events.types() & {"worker-online", "worker-heartbeat"},
                timeout=15,
                what=f"a worker event from {node}",
            )
            app.send_task("celery.accumulate", args=(7,), kwargs={"index": 0}, queue=queue)
            wait_for(
                lambda: {"task-received", "task-succeeded"} <= events.types(),
                timeout=30,
                what=f"task events from {node} (-E)",
            )
    finally:
        stop_group(proc)
