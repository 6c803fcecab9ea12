"""One lease-heartbeat thread per process: while a claimed body without ``start_to_close`` runs,
its lease is renewed every third of the default lease, so only a vanished worker lets it expire
and a long body is never run again beside itself."""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta

from harvest_celery._store import tasks
from harvest_celery._store.records import Claim, utcnow
from harvest_celery._store.store import Store

log = logging.getLogger("harvest_celery")


class LeaseKeeper:
    def __init__(self, store: Store, lease: float) -> None:
        self.store = store
        self.lease = lease
        self._claims: dict[tuple[str, str, int], int] = {}
        self._lock = threading.Lock()
        self._pid = -1
        self._wake = threading.Event()

    def hold(self, claim: Claim) -> None:
        key = (claim.execution_id, claim.activity_id, claim.attempt)
        with self._lock:
            self._claims[key] = self._claims.get(key, 0) + 1
            if self._pid != os.getpid():  # one thread per process (a forked child starts its own)
                self._pid = os.getpid()
                threading.Thread(target=self._loop, name="harvest-leases", daemon=True).start()

    def release(self, claim: Claim) -> None:
        key = (claim.execution_id, claim.activity_id, claim.attempt)
        with self._lock:
            left = self._claims.get(key, 0) - 1
            if left > 0:
                self._claims[key] = left
            else:
                self._claims.pop(key, None)

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._claims = {}
        self._pid = -1

    def _loop(self) -> None:
        while not self._wake.wait(self.lease / 3):
            with self._lock:
                held = list(self._claims)
            if held:
                self.renew(held)

    def renew(self, held: list[tuple[str, str, int]]) -> None:
        now = utcnow()
        until = now + timedelta(seconds=self.lease + 5)
        try:
            with self.store.begin() as tx:
                for execution_id, activity_id, attempt in held:
                    tasks.renew_lease(tx, execution_id, activity_id, attempt, now, until)
        except Exception:  # noqa: BLE001 - the next beat retries; the lease has slack
            log.exception("renewing %d leases failed", len(held))
