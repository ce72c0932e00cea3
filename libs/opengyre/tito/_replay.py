"""A whole conversation (an OpenAI message list with tools) as the proxy would have recorded it, call by call.

SFT on reference trajectories must train on the ids the policy sees and emits behind the gateway, not on a
second rendering of the messages. So the conversation goes through the gateway's own pieces: the OpenAI
dialect's parsing (validation and normalisation of messages and tools), TITO planning (each assistant turn's
prompt extends the previous call's prompt + output ids, as in a live execution), and the chat codec for the
reply's ids (the template's text for it, ``<tool_call>`` tags included, then the end-of-turn token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opengyre.chat import ChatCodec
from opengyre.events import TrajectoryRole
from opengyre.wire import ApiError
from opengyre.wire.openai import parse_chat

from ._trajectory import ExecutionTrajectory, TitoNode

__all__ = ["replay_conversation"]


def replay_conversation(
    codec: ChatCodec,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    execution_id: str = "replay",
    role: TrajectoryRole = "main",
) -> list[TitoNode]:
    """One node per assistant message (call id ``turn-<index>``), in order, each the child of the one before.

    A node's prompt is what the proxy sends the engine for that turn of a live execution; its output is the
    reply's ids as the model emits them (``ChatCodec.reply_ids``). Bad messages or tools raise ``ValueError``
    with the gateway's own 400 message; a conversation without an assistant turn is an error too.
    """
    try:
        req = parse_chat({"model": "replay", "messages": list(messages), "tools": tools})
    except ApiError as exc:
        raise ValueError(f"conversation {execution_id}: {exc.message}") from exc
    msgs = req.messages or []
    traj = ExecutionTrajectory(execution_id, codec)
    nodes: list[TitoNode] = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        if i == 0:
            raise ValueError(f"conversation {execution_id} starts with an assistant turn: nothing prompts it")
        plan = traj.plan(msgs[:i], req.tools)
        nodes.append(traj.commit(plan, f"turn-{i}", codec.reply_ids(msgs[:i], m, req.tools), m, role))
    if not nodes:
        raise ValueError(f"conversation {execution_id} has no assistant turn")
    return nodes
