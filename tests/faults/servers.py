"""The Postgres cluster and the Redis server the fault suite owns: started in a temp directory on
their own ports, so the suite can restart them, stop them for an outage, and wipe them afterwards
without touching the machine's own services.

Postgres refuses to run as root: ``initdb`` and ``pg_ctl`` run as the ``postgres`` user (via
``runuser``) when the suite runs as root. The binaries are found under
``/usr/lib/postgresql/*/bin`` (or ``HARVEST_FAULTS_PG_BIN``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} after {timeout:.0f}s")


def pg_bin() -> Path:
    explicit = os.environ.get("HARVEST_FAULTS_PG_BIN")
    if explicit:
        return Path(explicit)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if not found:
        found = [p for p in (shutil.which("initdb"),) if p]
    if not found:
        raise RuntimeError("no Postgres binaries: install postgresql or set HARVEST_FAULTS_PG_BIN")
    return Path(found[-1]).parent


class Postgres:
    """A private cluster: ``start``, ``crash`` (immediate stop: backends killed, as a crash),
    ``stop`` (fast), ``restart``, ``destroy`` (stop and remove the data directory)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bin = pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="harvest-faults-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self._as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, cwd="/")

    def init(self) -> None:
        if _port_open(self.port):
            raise RuntimeError(f"port {self.port} is taken: set HARVEST_FAULTS_PG_PORT")
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nfsync = off\n"
                "max_connections = 200\nshared_buffers = 64MB\n"
            )
        self.start()

    def start(self) -> None:
        out = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start", check=False
        )
        if out.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed ({out.returncode}): {out.stderr.decode()}\n{log}")
        _wait(lambda: _port_open(self.port), 30, "Postgres did not answer")

    def crash(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def restart(self) -> None:
        self.crash()
        self.start()

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


class Redis:
    """A private redis-server with no persistence: a restart loses every message it held."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="harvest-faults-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if _port_open(self.port):
            raise RuntimeError(f"port {self.port} is taken: set HARVEST_FAULTS_REDIS_PORT")
        with open(self.root / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.root),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait(self.ping, 30, "Redis did not answer")

    def ping(self) -> bool:
        out = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True)
        return out.stdout.strip() == b"PONG"

    def stop(self) -> None:
        """``shutdown nosave``: every message, acked or not, is gone."""
        if self.proc is None:
            return
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


RABBITMQ_BIN = Path(os.environ.get("HARVEST_FAULTS_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))


class RabbitMQ:
    """A private RabbitMQ node: its own node name, AMQP and distribution ports, data and log
    directories, Erlang cookie (``HOME``) and ``rabbitmq.conf`` — ``consumer_timeout`` set low,
    so an activity can outlive it. ``restart`` stops the node (the broker's own shutdown: durable
    queues and persistent messages survive, transient queues and unacked deliveries' channels do
    not) and starts it again. The machine's own node is never touched (commands name this one)."""

    def __init__(self, port: int, dist_port: int, consumer_timeout_ms: int) -> None:
        self.port = port
        self.dist_port = dist_port
        self.node = f"harvest_faults_{port}@localhost"
        self.root = Path(tempfile.mkdtemp(prefix="harvest-faults-rabbitmq-"))
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{port}\n"
            f"consumer_timeout = {consumer_timeout_ms}\n"
            "log.file.level = info\n"
        )
        (self.root / "enabled_plugins").write_text("[].\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        return dict(
            os.environ,
            HOME=str(self.root),  # the node's own Erlang cookie
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.root / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.root / "log"),
            RABBITMQ_CONFIG_FILE=str(self.root / "rabbitmq"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.root / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.root / "rabbitmq.pid"),
        )

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-q", "-n", self.node, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
            cwd="/",
        )

    def start(self) -> None:
        for port in (self.port, self.dist_port):
            if _port_open(port):
                raise RuntimeError(f"port {port} is taken: set HARVEST_FAULTS_AMQP_PORT / _DIST_PORT")
        subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmq-server"), "-detached"],
            env=self._env(),
            check=True,
            capture_output=True,
            cwd="/",
        )
        _wait(
            lambda: self.ctl("await_startup", "--timeout", "5", check=False).returncode == 0,
            90,
            "RabbitMQ did not start",
        )
        _wait(lambda: _port_open(self.port), 30, "RabbitMQ did not answer")

    def stop(self) -> None:
        self.ctl("stop", check=False)
        _wait(
            lambda: not _port_open(self.port) and not _port_open(self.dist_port), 60, "RabbitMQ did not stop"
        )

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def destroy(self) -> None:
        if _port_open(self.port) or _port_open(self.dist_port):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
