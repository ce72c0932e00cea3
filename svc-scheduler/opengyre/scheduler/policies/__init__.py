"""Scheduling policies, one small module each, behind ``opengyre.scheduler.Policy``."""

from __future__ import annotations

from typing import Any

from .._policy import Policy
from ._async import AsyncPolicy, AsyncStreamingPolicy
from ._carry import CarryOverPolicy
from ._colocate import ColocatePolicy, ColocateResidentPolicy
from ._elastic import ElasticPolicy

__all__ = [
    "POLICIES",
    "AsyncPolicy",
    "AsyncStreamingPolicy",
    "CarryOverPolicy",
    "ColocatePolicy",
    "ColocateResidentPolicy",
    "ElasticPolicy",
    "make_policy",
]

POLICIES: dict[str, type[Policy]] = {
    p.name: p
    for p in (ElasticPolicy, ColocatePolicy, ColocateResidentPolicy, AsyncPolicy, AsyncStreamingPolicy, CarryOverPolicy)
}


def make_policy(name: str, **params: Any) -> Policy:
    """A policy by name; unknown names and parameters fail with the list of what exists."""
    cls = POLICIES.get(name)
    if cls is None:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"policy {name}: {exc}") from exc
