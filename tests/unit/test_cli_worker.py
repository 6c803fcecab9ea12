"""``harvest worker`` as a good Celery citizen: every option it does not own goes to ``celery
worker`` unchanged, and without ``-n`` each role gets its own node name."""

from __future__ import annotations

import os
import re
import sys

import pytest

from harvest_celery import _cli
from harvest_celery._cli import default_node_name, main, worker_argv, worker_queues

APP = "tests.unit.cli_app"
NODE_NAME = re.compile(r"^[A-Za-z0-9_.-]+@%h$")


@pytest.fixture
def exec_argv(cli_db, monkeypatch):
    """``exec_argv(*cli_args)``: runs ``harvest worker -A <celery app> *cli_args`` in-process and
    returns the argv it would exec (no worker starts)."""
    cli_db(APP)
    monkeypatch.setenv("HARVEST_CLI_TEST_CELERY", "1")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    seen: dict[str, object] = {}
    monkeypatch.setattr(_cli, "_exec", lambda argv, env: seen.update(argv=argv, env=env))

    def run(*cli_args: str) -> list[str]:
        seen.clear()
        assert main(["worker", "-A", f"{APP}:celery_harvest", *cli_args]) == 0
        env = seen["env"]
        assert isinstance(env, dict)
        if env.get("PROMETHEUS_MULTIPROC_DIR"):
            os.rmdir(env["PROMETHEUS_MULTIPROC_DIR"])
        argv = seen["argv"]
        assert isinstance(argv, list)
        return argv

    return run


def _count(argv: list[str], *options: str) -> int:
    return sum(
        1 for a in argv if a in options or any(a.startswith(o + "=") for o in options if o.startswith("--"))
    )


def test_celery_options_pass_through_unchanged(exec_argv):
    given = ["-n", "x@%h", "-E", "-c", "2", "-P", "threads", "--loglevel", "WARNING"]
    argv = exec_argv(*given)
    assert argv[:6] == [sys.executable, "-m", "celery", "-A", f"{APP}:app", "worker"]
    assert argv[-len(given) :] == given  # in order, untouched
    assert _count(argv, "-n", "--hostname") == 1  # the user's -n replaces the default name
    assert _count(argv, "-l", "--loglevel") == 1  # and their level the default INFO
    assert argv[argv.index("-Q") + 1] == "default,harvest"


@pytest.mark.parametrize(
    "given",
    [
        ["-O", "fair", "--without-gossip", "--without-mingle", "-Ofair", "--max-tasks-per-child=10"],
        ["--hostname=a@%h", "-lDEBUG", "--autoscale", "10,3", "--pidfile", "/tmp/w.pid"],
        ["-E", "--q", "--metrics", "-B"],  # no abbreviation of harvest's own options is taken
    ],
)
def test_any_unknown_option_reaches_celery(exec_argv, given):
    argv = exec_argv(*given)
    assert argv[-len(given) :] == given


def test_harvest_owned_options_are_not_passed_twice(exec_argv):
    argv = exec_argv(
        "-Q",
        "payments,harvest",
        "--metrics-port",
        "9808",
        "--metrics-addr",
        "0.0.0.0",
        "--database-url",
        "sqlite://",
        "-E",
    )
    assert argv.count("-A") == 1 and argv[argv.index("-A") + 1] == f"{APP}:app"
    assert _count(argv, "-Q", "--queues") == 1 and argv[argv.index("-Q") + 1] == "payments,harvest"
    for harvest_only in (
        "--metrics-port",
        "--metrics-addr",
        "--database-url",
        "9808",
        "0.0.0.0",
        "sqlite://",
    ):
        assert harvest_only not in argv
    assert argv[-1] == "-E"
    # The same with --opt=value forms and -A before the command.
    argv = exec_argv("--queues=alpha", "--app", f"{APP}:celery_harvest", "--metrics-port=9808")
    assert argv.count("-A") == 1 and not any(a.startswith(("--app", "--metrics", "--queues")) for a in argv)
    assert argv[argv.index("-Q") + 1] == "alpha"


def test_default_node_name_per_role(exec_argv):
    def node(*cli_args: str) -> str:
        argv = exec_argv(*cli_args)
        assert _count(argv, "-n", "--hostname") == 1
        flag = "-n" if "-n" in argv else "--hostname"
        return argv[argv.index(flag) + 1]

    assert node() == "harvest-default-harvest@%h"
    assert node("-Q", "harvest") == "harvest-decide@%h"
    assert node("-Q", "harvest,default") == "harvest-harvest-default@%h"
    assert (
        node("-Q", "payments, inventory,pricing,default") == "harvest-payments-inventory-pricing-default@%h"
    )
    assert node("-Q", "payments", "-c", "4") == "harvest-payments@%h"
    assert node("-Q", "payments", "--hostname", "pay@%h") == "pay@%h"


def test_default_level_is_info_unless_given(exec_argv):
    argv = exec_argv()
    assert argv[argv.index("--loglevel") + 1] == "INFO"
    for given in (["-l", "DEBUG"], ["-lDEBUG"], ["--loglevel=DEBUG"]):
        argv = exec_argv(*given)
        assert _count(argv, "-l", "--loglevel") + sum(a.startswith("-lD") for a in argv) == 1
        assert "INFO" not in argv


def test_worker_argv_is_pure():
    argv = worker_argv("proj:app", ["harvest"], "harvest", ["-E", "-c", "2"])
    assert argv == [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "proj:app",
        "worker",
        "-Q",
        "harvest",
        "-n",
        "harvest-decide@%h",
        "--loglevel",
        "INFO",
        "-E",
        "-c",
        "2",
    ]
    assert worker_argv("proj:app", ["a"], "harvest", ["-n", "me@%h", "-l", "INFO"]) == [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "proj:app",
        "worker",
        "-Q",
        "a",
        "-n",
        "me@%h",
        "-l",
        "INFO",
    ]
    # After "--" nothing is an option of celery worker's.
    assert "harvest-a@%h" in worker_argv("proj:app", ["a"], "harvest", ["--", "-n"])


def test_worker_queues():
    assert worker_queues(None, "harvest") == ["default", "harvest"]
    assert worker_queues("", "decide") == ["default", "decide"]
    assert worker_queues(" a, b,,a ", "harvest") == ["a", "b"]


def test_node_names_are_valid_and_long_ones_stay_distinct():
    assert default_node_name(["decide"], "decide") == "harvest-decide@%h"
    assert default_node_name(["harvest"], "decide") == "harvest-harvest@%h"
    odd = default_node_name(["jobs:high", "über/low", "a.b_c"], "harvest")
    assert odd == "harvest-jobs_high-_ber_low-a.b_c@%h" and NODE_NAME.match(odd)
    many = [f"queue{i:02d}" for i in range(20)]
    one, other = default_node_name(many, "harvest"), default_node_name([*many, "x"], "harvest")
    for name in (one, other):
        assert NODE_NAME.match(name) and len(name.split("@")[0]) <= 48 and name.startswith("harvest-queue00-")
    assert one != other


def test_other_commands_still_refuse_unknown_options(db_for_list, capsys):
    assert main(["--database-url", db_for_list, "list", "-E"]) == 2
    assert "unrecognized arguments: -E" in capsys.readouterr().err


@pytest.fixture
def db_for_list(cli_db):
    return cli_db(APP)
