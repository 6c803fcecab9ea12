"""A PgBouncer of the suite's own, in transaction pooling mode, in front of the test Postgres.

Debian's ``pgbouncer`` (``.ci/run`` installs it), started on a port derived from the test slot
(``HARVEST_TEST_SLOT``: 16431 + slot, so two sessions never share one), with its configuration,
user list, log and pid file in a temporary directory of its own, ``auth_type = trust`` against
127.0.0.1:5432. A process running as root starts it as ``postgres`` (PgBouncer refuses root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.processes import stop_group

PORT = 16431 + int(os.environ.get("HARVEST_TEST_SLOT") or "0")
BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

CONFIG = """\
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
pool_mode = transaction
max_client_conn = 200
default_pool_size = 8
ignore_startup_parameters = extra_float_digits,options
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


class PgBouncer:
    def __init__(self, directory: Path, proc: subprocess.Popen[bytes]) -> None:
        self.directory = directory
        self.proc = proc
        self.port = PORT

    def url(self, database: str, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def running() -> Iterator[PgBouncer]:
    directory = Path(tempfile.mkdtemp(prefix="harvest-pgbouncer-"))
    (directory / "users.txt").write_text('"postgres" ""\n')
    (directory / "pgbouncer.ini").write_text(CONFIG.format(port=PORT, dir=directory))
    cmd = [BINARY]
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in [directory, *directory.iterdir()]:
            os.chown(path, owner.pw_uid, owner.pw_gid)
        cmd += ["-u", "postgres"]
    out = open(directory / "stdout.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*cmd, str(directory / "pgbouncer.ini")], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_for_port(proc, directory)
        yield PgBouncer(directory, proc)
    finally:
        stop_group(proc)
        out.close()
        shutil.rmtree(directory, ignore_errors=True)


def _wait_for_port(proc: subprocess.Popen[bytes], directory: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited: {(directory / 'stdout.log').read_text(errors='replace')}")
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"pgbouncer not listening on {PORT} after {timeout}s")
