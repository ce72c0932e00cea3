"""Fixtures of real CPU engines in this process, shared by the engine's tests and the proxy's (their conftests
import them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import torch

from opengyre.engine import EngineConfig, EngineServer

__all__ = ["engine_a", "engine_b", "one_torch_thread"]


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    # Two cores are shared by several test runs: one intra-op thread avoids oversubscription stalls.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
async def engine_a() -> AsyncIterator[EngineServer]:
    async with EngineServer(EngineConfig(port=0)) as srv:
        yield srv


@pytest.fixture
async def engine_b() -> AsyncIterator[EngineServer]:
    async with EngineServer(EngineConfig(port=0)) as srv:
        yield srv
