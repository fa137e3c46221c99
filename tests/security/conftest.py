"""Fixtures for the security tier (the shared ones live in tests/conftest.py)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sandboxd.config import Settings
from sandboxd.server import create_app
from tests.conftest import make_settings
from tests.security.helpers import create_sandbox

ClientFactory = Callable[..., Awaitable[Any]]


@pytest.fixture
async def sandbox(client: Any) -> dict[str, Any]:
    """A python sandbox on the in-process app."""
    return await create_sandbox(client)


@pytest.fixture
def make_client(aiohttp_client: Any, short_tmp: Path) -> ClientFactory:
    """An in-process client on an app with some limits changed (own data dir per call)."""

    async def make(*, settings_update: dict[str, Any] | None = None, **limits: Any) -> Any:
        root = short_tmp / f"c{secrets.token_hex(3)}"
        root.mkdir(mode=0o711)
        settings: Settings = make_settings(root, **limits).model_copy(update=settings_update or {})
        test_client = await aiohttp_client(create_app(settings))
        test_client.settings = settings
        return test_client

    return make
