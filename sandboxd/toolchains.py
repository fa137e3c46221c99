"""What each language binds into a sandbox, the environment it needs, and its test runner.

The toolchains are the host's own, bound read-only. By default python is
Debian's /usr/bin/python3 (never the daemon's own interpreter or venv, so
aiohttp and friends are not importable inside), node and go are the first
found in /usr/bin or on PATH. A toolchain outside /usr has its prefix bound
at the same path. Test runners that Debian does not ship (jest; pytest where
python3-pytest is missing) are provisioned once by `sandboxd toolchains
install` into the toolchains folder and bound read-only under /opt/sandboxd.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.config import Settings
from sandboxd.models import Language

HOME = "/home/sandbox"
SHIM_DIR = "/opt/sandboxd/bin"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
PROVISIONED = "/opt/sandboxd"  # where the toolchains folder's parts are bound

JEST_VERSION = "29.7.0"
PYTEST_VERSION = "8.3.5"

# Prefer the project's own jest; `exec` so jest's exit code is the runner's.
# Jest refuses to run where it finds neither package.json nor a jest.config.*;
# an empty inline config then makes the workspace the root.
_JEST = """
set -- --ci --watchman=false
if [ ! -e package.json ] && ! ls jest.config.* >/dev/null 2>&1; then set -- "$@" --config "{}"; fi
if [ -x node_modules/.bin/jest ]; then exec node_modules/.bin/jest "$@"; fi
exec jest "$@"
"""


@dataclass(frozen=True)
class Toolchain:
    language: Language
    executable: str
    install_hint: str
    runner: str
    runner_display: str
    runner_argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    # Directories put in front of PATH inside the sandbox.
    path: tuple[str, ...] = ()
    # name -> target: symlinks made in SHIM_DIR so the usual command names work.
    shims: Mapping[str, str] = field(default_factory=dict)
    # (host path, sandbox path) pairs bound read-only.
    ro_binds: tuple[tuple[str, str], ...] = ()
    # What must exist for the runner to work, and how to get it.
    runner_files: tuple[str, ...] = ()
    runner_hint: str = ""

    @property
    def search_path(self) -> str:
        return ":".join((SHIM_DIR, *self.path, SYSTEM_PATH))

    def missing(self) -> str | None:
        """Why this toolchain cannot run at all, or None if it can."""
        if os.access(self.executable, os.X_OK):
            return None
        return f"{self.executable} is not installed; {self.install_hint}"

    def runner_missing(self) -> str | None:
        if not self.runner_files or any(os.path.exists(p) for p in self.runner_files):
            return None
        return f"{self.runner} is not available; {self.runner_hint}"


def _shim(name: str, *candidates: str) -> dict[str, str]:
    """Point ``name`` at the first candidate that exists, unless /usr/bin has it already."""
    if os.path.exists(f"/usr/bin/{name}"):
        return {}
    for target in candidates:
        if os.path.exists(target):
            return {name: target}
    return {}


def _prefix_binds(executable: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """A toolchain outside /usr: bind its prefix (the folder above bin/) at the same path."""
    real = os.path.realpath(executable)
    if real.startswith("/usr/"):
        return (), ()
    prefix = os.path.dirname(os.path.dirname(real))
    return ((prefix, prefix),), (os.path.dirname(real),)


def _find(name: str, configured: Path | None) -> str:
    if configured is not None:
        return str(configured)
    if os.path.exists(f"/usr/bin/{name}"):
        return f"/usr/bin/{name}"
    return shutil.which(name) or f"/usr/bin/{name}"


def _python(settings: Settings, tools: Path) -> Toolchain:
    config = settings.toolchains.get(Language.python)
    exe = str(config.executable) if config and config.executable else "/usr/bin/python3"
    binds, path = _prefix_binds(exe)
    env = {
        # Unbuffered, so stdout and stderr interleave in the order they were written.
        "PYTHONUNBUFFERED": "1",
        # Debian marks its python "externally managed"; inside a sandbox a
        # plain `pip install` should work, and as a non-root user pip falls
        # back to a user install in the sandbox's own home, which persists.
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
    }
    provisioned = tools / "python"
    if (provisioned / "pytest").is_dir():
        binds += ((str(provisioned), f"{PROVISIONED}/python"),)
        env["PYTHONPATH"] = f"{PROVISIONED}/python"
    return Toolchain(
        language=Language.python,
        executable=exe,
        install_hint="install it with: sudo apt-get install python3 python3-pip",
        runner="pytest",
        runner_display="python3 -m pytest tests",
        runner_argv=("python3", "-m", "pytest", "tests"),
        env=env,
        path=path,
        shims={
            **_shim("python", exe),
            **_shim("pip", "/usr/bin/pip3"),
            **_shim("pytest", "/usr/bin/pytest-3"),
        },
        ro_binds=binds,
        runner_files=(
            "/usr/lib/python3/dist-packages/pytest",
            str(provisioned / "pytest"),
        ),
        runner_hint="run `sandboxd toolchains install` (or apt-get install python3-pytest)",
    )


def _node(settings: Settings, tools: Path) -> Toolchain:
    config = settings.toolchains.get(Language.node)
    exe = _find("node", config.executable if config else None)
    binds, path = _prefix_binds(exe)
    provisioned = tools / "node"
    if (provisioned / "node_modules").is_dir():
        binds += ((str(provisioned), f"{PROVISIONED}/node"),)
        path += (f"{PROVISIONED}/node/node_modules/.bin",)
    return Toolchain(
        language=Language.node,
        executable=exe,
        install_hint="install Node.js: sudo apt-get install nodejs npm",
        runner="jest",
        runner_display="jest --ci (the project's node_modules/.bin/jest when it has one)",
        runner_argv=("/bin/sh", "-c", _JEST),
        env={"NPM_CONFIG_UPDATE_NOTIFIER": "false", "NO_UPDATE_NOTIFIER": "1"},
        path=path,
        ro_binds=binds,
        runner_files=(str(provisioned / "node_modules" / ".bin" / "jest"),),
        runner_hint="run `sandboxd toolchains install` (or add jest to the project)",
    )


def _go(settings: Settings, tools: Path) -> Toolchain:
    config = settings.toolchains.get(Language.go)
    exe = _find("go", config.executable if config else None)
    binds, path = _prefix_binds(exe)
    return Toolchain(
        language=Language.go,
        executable=exe,
        install_hint="install it with: sudo apt-get install golang-go",
        runner="go test",
        runner_display="go test -v ./...",
        runner_argv=("go", "test", "-v", "./..."),
        env={
            # Module and build caches live in the sandbox's home: per sandbox,
            # outside the workspace, gone with the sandbox.
            "GOPATH": f"{HOME}/go",
            "GOCACHE": f"{HOME}/.cache/go-build",
            # No network inside: fail fast instead of trying to download.
            "GOPROXY": "off",
            "GOTOOLCHAIN": "local",
        },
        path=path,
        ro_binds=binds,
    )


_FACTORIES = {Language.python: _python, Language.node: _node, Language.go: _go}


def detect(settings: Settings) -> dict[Language, Toolchain]:
    """Look at the host once; the result is reused for every exec."""
    tools = settings.toolchains_dir
    return {lang: make(settings, tools) for lang, make in _FACTORIES.items()}


def version_of(toolchain: Toolchain) -> str | None:
    """The toolchain's own version line, or None if it does not run."""
    flag = "version" if toolchain.language is Language.go else "--version"
    try:
        out = subprocess.run(
            [toolchain.executable, flag], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if out.returncode == 0 and text else None


class ProvisionError(Exception):
    """A runner could not be installed; the message says what to do."""


def _readable_by_all(root: Path) -> None:
    # Root's sandboxes run as an unprivileged uid that must read these files.
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444)


def _provision(target: Path, argv_for: Callable[[Path], list[str]]) -> None:
    """Install into a staging folder, then rename it into place: never half-installed."""
    staging = target.with_name(f".{target.name}-new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        out = subprocess.run(argv_for(staging), capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ProvisionError(f"{exc}") from exc
    if out.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise ProvisionError((out.stderr or out.stdout).strip()[-2000:])
    _readable_by_all(staging)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(staging, target)


def install_runners(settings: Settings) -> list[str]:
    """Provision the test runners the host lacks into the toolchains folder; say what was done."""
    tools = settings.toolchains_dir
    tools.mkdir(parents=True, exist_ok=True)
    os.chmod(tools, 0o755)
    chains = detect(settings)
    report = []

    node = chains[Language.node]
    if node.runner_missing() is None:
        report.append(f"jest: already installed in {tools / 'node'}")
    else:
        npm = shutil.which("npm")
        if npm is None:
            raise ProvisionError("npm is not installed: sudo apt-get install npm")
        _provision(
            tools / "node",
            lambda d: [
                npm,
                "install",
                "--prefix",
                str(d),
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                f"jest@{JEST_VERSION}",
            ],
        )
        report.append(f"jest {JEST_VERSION}: installed into {tools / 'node'}")

    python = chains[Language.python]
    if python.runner_missing() is None:
        report.append("pytest: already available")
    elif python.missing() is not None:
        report.append(f"pytest: skipped, {python.missing()}")
    else:
        _provision(
            tools / "python",
            lambda d: [
                python.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(d),
                f"pytest=={PYTEST_VERSION}",
            ],
        )
        report.append(f"pytest {PYTEST_VERSION}: installed into {tools / 'python'}")
    return report
