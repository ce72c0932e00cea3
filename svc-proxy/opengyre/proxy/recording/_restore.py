"""Rebuild an execution's live TITO state from the trajectory store (after a proxy restart).

Every stored call carries its token delta and its conversation delta, so the prompts, outputs and the
conversation hashes that extension and retry matching need come back exactly as they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opengyre.chat import ChatCodec
from opengyre.tito import ExecutionTrajectory, Plan, tools_key

from ._atif import context_of, conversations
from ._trees import StoredCall

__all__ = ["restore_trajectory"]


def restore_trajectory(
    execution_id: str,
    codec: ChatCodec,
    calls: Sequence[StoredCall],
    contexts: Mapping[str, dict[str, Any]] | None = None,
) -> ExecutionTrajectory:
    t = ExecutionTrajectory(execution_id, codec)
    convs = conversations(calls, contexts)
    tools_of: dict[str | None, list[dict[str, Any]] | None] = {None: None}
    for c in calls:
        e = c.event
        ctx = context_of(e, contexts)
        tools = ctx["tools"] if "tools" in ctx else tools_of.get(e.parent_call_id)
        tools_of[e.call_id] = tools
        chat = "messages" in ctx and ctx.get("response") is not None
        plan = Plan(
            prompt_ids=[],  # commit keeps the delta (like the tree): a full prompt per call would be the flat size
            parent_call_id=e.parent_call_id,
            prefix_len=e.prefix_len,
            delta_ids=list(e.prompt_delta_ids),
            branch=e.branch or "root",
            drift=e.drift,
            context=ctx,
            messages=convs[e.call_id] if chat else None,
            tools_key=tools_key(tools),
        )
        t.commit(plan, e.call_id, e.output_ids, ctx.get("response") if chat else None, e.role)
    return t
