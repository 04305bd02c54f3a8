"""The configuration: every SLICESCHED_* variable declared once (service/environment.py), read
nowhere else, and a malformed value refused naming its variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from service import environment as env
from service.domain.error import InvalidInputError, InvariantError

ROOT = Path(__file__).resolve().parents[2]
CODE = [p for pkg in ("service", "executor", "learned") for p in (ROOT / pkg).rglob("*.py")]


def _env_reads(tree: ast.AST) -> list[str]:
    """The names read from the environment: ``os.environ.get(X)``, ``os.getenv(X)``,
    ``os.environ[X]`` (loads), X a literal or a name."""
    found = []
    for node in ast.walk(tree):
        arg: ast.expr | None = None
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv", "environ.get"):
            arg = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and ast.unparse(node.value) == "os.environ":
            arg = node.slice
        if arg is not None:
            found.append(arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg))
    return found


def test_no_module_but_the_environment_module_reads_a_slicesched_variable() -> None:
    offenders = []
    for path in CODE:
        if path == ROOT / "service" / "environment.py":
            continue
        for name in _env_reads(ast.parse(path.read_text())):
            if str(name).startswith("SLICESCHED_") or str(name).endswith("_ENV"):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_every_variable_the_code_names_is_declared() -> None:
    named = {m for p in CODE for m in re.findall(r"SLICESCHED_[A-Z0-9_]*[A-Z0-9]\b", p.read_text())}
    assert named - set(env.VARIABLES) == set()


def test_an_undeclared_variable_is_a_bug_not_a_default() -> None:
    with pytest.raises(InvariantError, match="not declared"):
        env.raw("SLICESCHED_NO_SUCH_THING")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("SLICESCHED_LEASE_TTL_S", "-1", r"SLICESCHED_LEASE_TTL_S must be in \(0, 3600\]"),
    ("SLICESCHED_LEASE_TTL_S", "soon", "SLICESCHED_LEASE_TTL_S must be a number"),
    ("SLICESCHED_MAX_BATCH", "2.5", "SLICESCHED_MAX_BATCH must be an integer"),
    ("SLICESCHED_MAX_BATCH", "0", r"SLICESCHED_MAX_BATCH must be in \[1, 4096\]"),
    ("SLICESCHED_SLICE_RETENTION_S", "0", "SLICESCHED_SLICE_RETENTION_S must be in"),
    ("SLICESCHED_HEADROOM_UTILISATION", "nan", "SLICESCHED_HEADROOM_UTILISATION must be in"),
    ("SLICESCHED_AUDIT", "maybe", "SLICESCHED_AUDIT must be 1 or 0"),
])
def test_the_service_refuses_a_malformed_value_at_start_naming_it(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                   value: str, message: str) -> None:
    from service.live.settings import ServiceSettings

    monkeypatch.setenv("SLICESCHED_ADMIN_KEY", "admin-key-for-this-test")
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInputError, match=message) as caught:
        ServiceSettings.from_env()
    assert caught.value.culprit == name


def test_values_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLICESCHED_MAX_BATCH", raising=False)
    assert env.number("SLICESCHED_MAX_BATCH", int) == 8
    monkeypatch.setenv("SLICESCHED_MAX_BATCH", " 16 ")
    assert env.number("SLICESCHED_MAX_BATCH", int) == 16
    monkeypatch.setenv("SLICESCHED_EXECUTOR_KINDS", "A100-80GB, ,H100")
    assert env.names("SLICESCHED_EXECUTOR_KINDS") == ("A100-80GB", "H100")
    monkeypatch.setenv("SLICESCHED_CONFIRM_DRAINS", "Off")
    assert env.flag("SLICESCHED_CONFIRM_DRAINS") is False


def test_the_listing_masks_secrets_and_the_docs_table_lists_every_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLICESCHED_NEO4J_PASSWORD", "hunter2-hunter2")
    rows = {r["name"]: r for r in env.listing()}
    assert rows["SLICESCHED_NEO4J_PASSWORD"]["value"] == "(set)"
    assert "hunter2" not in str(env.listing()) and "hunter2" not in env.markdown()
    table = env.markdown()
    assert all(f"`{name}`" in table for name in env.VARIABLES)


def test_slicesched_config_lists_and_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import cli_in_process

    listed = cli_in_process("config", "--json")
    assert listed.returncode == 0 and "SLICESCHED_LEASE_TTL_S" in listed.stdout
    monkeypatch.setenv("SLICESCHED_HEARTBEAT_S", "0")
    bad = cli_in_process("config")
    assert bad.returncode == 2 and "SLICESCHED_HEARTBEAT_S must be in (0, 600]" in bad.stderr
