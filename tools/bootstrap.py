"""Create or reuse the project's virtual environment.

The heavy dependencies (torch is several GB) live in a shared environment under
``$SLICESCHED_CACHE`` (default ``~/.cache/slicesched``), keyed by a hash of the declared
dependency spec and the Python version, so a fresh clone on the same machine reuses it. The
project's own ``.venv`` is a light environment that sees the shared one through a ``.pth`` file
and points at this clone's source tree, so two clones never point at each other's code.
Idempotent: a second run takes well under a second.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dependency_key() -> tuple[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = sorted(project["dependencies"] + project["optional-dependencies"]["dev"])
    spec = "\n".join(deps) + f"\npy{sys.version_info.major}.{sys.version_info.minor}"
    return hashlib.sha256(spec.encode()).hexdigest()[:16], deps


def site_packages(env: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_config_var("base"))
    return env / rel


def run(*args: str | Path) -> None:
    subprocess.run([str(a) for a in args], check=True)


def ensure_shared(key: str, deps: list[str]) -> Path:
    cache = Path(os.environ.get("SLICESCHED_CACHE", Path.home() / ".cache" / "slicesched"))
    env = cache / "venvs" / key
    done = env / ".complete"
    if done.exists():
        return env
    print(f"[venv] installing dependencies into {env} (once per machine; torch is large)", flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    run(env / "bin" / "python", "-m", "pip", "install", "--quiet", "--upgrade", "pip", "setuptools", "wheel")
    run(env / "bin" / "python", "-m", "pip", "install", "--progress-bar", "off", *deps)
    done.write_text("\n".join(deps) + "\n")
    return env


def ensure_local(shared: Path, key: str) -> None:
    local = ROOT / ".venv"
    stamp = local / ".slicesched-key"
    if local.is_symlink():
        local.unlink()
    if not (stamp.exists() and stamp.read_text() == key):
        venv.EnvBuilder(with_pip=False, clear=True).create(local)
        (site_packages(local) / "_slicesched_shared.pth").write_text(f"{site_packages(shared)}\n")
        stamp.write_text(key)
    # This clone's code: a .pth entry and a console script, rewritten every time so that the
    # environment always points at the clone it belongs to (no pip, so this takes milliseconds).
    (site_packages(local) / "_slicesched_project.pth").write_text(f"{ROOT}\n")
    script = local / "bin" / "slicesched"
    script.write_text(
        f"#!{local / 'bin' / 'python'}\n"
        "import sys\n"
        "from service.cli import main\n"
        "sys.exit(main())\n"
    )
    script.chmod(0o755)


def main() -> None:
    key, deps = dependency_key()
    shared = ensure_shared(key, deps)
    ensure_local(shared, key)
    print(f"[venv] ready: {ROOT / '.venv'} (shared deps {key})", flush=True)


if __name__ == "__main__":
    main()
