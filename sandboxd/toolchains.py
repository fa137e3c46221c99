"""What each language binds into a sandbox, the environment it needs, and its test runner.

The toolchains are the host's own, bound read-only: Debian's python3 (with
python3-pytest), node, and golang-go all live under /usr. The daemon's own
Python environment (a venv elsewhere) is never bound, so its packages are
not importable inside.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field

from sandboxd.models import Language

HOME = "/home/sandbox"
SHIM_DIR = "/opt/sandboxd/bin"
BASE_PATH = f"{SHIM_DIR}:/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Toolchain:
    language: Language
    # The program whose absence makes the toolchain unusable, and how to install it.
    executable: str
    install_hint: str
    runner: str
    runner_argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    # name -> target: symlinks made in SHIM_DIR so the usual command names work.
    shims: Mapping[str, str] = field(default_factory=dict)
    # Host paths outside /usr the toolchain needs, bound read-only at the same place.
    ro_binds: tuple[str, ...] = ()

    def missing(self) -> str | None:
        """Why this toolchain cannot run, or None if it can."""
        if os.access(self.executable, os.X_OK):
            return None
        return f"{self.executable} is not installed; {self.install_hint}"


def _shim(name: str, *candidates: str) -> dict[str, str]:
    """Point ``name`` at the first candidate that exists, unless /usr/bin has it already."""
    if os.path.exists(f"/usr/bin/{name}"):
        return {}
    for target in candidates:
        if os.path.exists(target):
            return {name: target}
    return {}


def _python() -> Toolchain:
    return Toolchain(
        language=Language.python,
        executable="/usr/bin/python3",
        install_hint="install it with: apt-get install python3 python3-pip python3-pytest",
        runner="pytest",
        runner_argv=("python3", "-m", "pytest", "tests"),
        env={
            # Unbuffered, so stdout and stderr interleave in the order they were written.
            "PYTHONUNBUFFERED": "1",
            # Debian marks its python "externally managed"; inside a sandbox a
            # plain `pip install` should work, and as a non-root user pip falls
            # back to a user install in the sandbox's own home.
            "PIP_BREAK_SYSTEM_PACKAGES": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        },
        shims={
            **_shim("python", "/usr/bin/python3"),
            **_shim("pip", "/usr/bin/pip3"),
            **_shim("pytest", "/usr/bin/pytest-3"),
        },
    )


def _node() -> Toolchain:
    return Toolchain(
        language=Language.node,
        executable="/usr/bin/node",
        install_hint="install Node.js (apt-get install nodejs npm)",
        runner="jest",
        runner_argv=("jest", "--ci"),
        env={"NODE_ENV": "test", "NPM_CONFIG_UPDATE_NOTIFIER": "false"},
    )


def _go() -> Toolchain:
    return Toolchain(
        language=Language.go,
        executable="/usr/bin/go",
        install_hint="install it with: apt-get install golang-go",
        runner="go test",
        runner_argv=("go", "test", "-v", "./..."),
        env={
            # Caches live in the sandbox's home: per sandbox, outside the
            # workspace, gone with the sandbox.
            "GOPATH": f"{HOME}/go",
            "GOCACHE": f"{HOME}/.cache/go-build",
            "GOPROXY": "off",
            "GOTOOLCHAIN": "local",
            "GOFLAGS": "-mod=mod",
        },
    )


_FACTORIES = {Language.python: _python, Language.node: _node, Language.go: _go}


def detect() -> dict[Language, Toolchain]:
    """Look at the host once; the result is reused for every exec."""
    return {lang: make() for lang, make in _FACTORIES.items()}


def bwrap_path() -> str | None:
    return shutil.which("bwrap")
