"""mypy accepts a user-written codec and store given to ``Harvest(...)`` (tests/unit/
typed_user_config.py, also in pyproject's mypy files) and refuses one that does not match the
Protocol; the same classes work at run time."""

from __future__ import annotations

from pathlib import Path

from mypy import api

from harvest_celery import WorkflowContext, activity, workflow
from tests.unit import typed_user_config as typed

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "tests" / "unit" / "typed_user_config.py"


def _mypy(path: Path) -> tuple[str, int]:
    out, err, status = api.run(
        [
            "--no-error-summary",
            "--follow-imports=silent",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(path),
        ]
    )
    return out + err, status


def test_mypy_accepts_the_user_written_codec_and_store() -> None:
    out, status = _mypy(MODULE)
    assert status == 0, out


def test_mypy_refuses_a_codec_without_decode(tmp_path: Path) -> None:
    broken = MODULE.read_text().replace("def decode(", "def undecode(")
    path = tmp_path / "broken_user_config.py"
    path.write_text(broken)
    out, status = _mypy(path)
    assert status == 1
    assert 'Argument "codec" to "Harvest" has incompatible type "Base64Codec"' in out, out


def test_pyproject_has_mypy_check_the_module() -> None:
    assert '"tests/unit/typed_user_config.py"' in (ROOT / "pyproject.toml").read_text()


@activity
def typed_echo(text: str) -> str:
    return text


@workflow
async def typed_flow(ctx: WorkflowContext, text: str) -> str:
    return str(await ctx.execute_activity(typed_echo, text))


def test_the_user_codec_and_store_carry_a_run(tmp_path: Path) -> None:
    store = typed.MemoryStore()
    harvest = typed.make(f"sqlite:///{tmp_path / 'typed.db'}", store).register(typed_echo, typed_flow)
    harvest.migrate()
    big = "x" * 500
    run = harvest.start_workflow("typed_flow", big)
    assert harvest.result(run, timeout=30) == big
    assert store.blobs  # the large input was offloaded to the user's store
    assert harvest.store.payloads.codec.codecs[0].codec_id == "b64"
