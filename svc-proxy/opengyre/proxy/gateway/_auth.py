"""Who is calling: the execution key (or the execution's URL) checked, the role claimed by the key or the role
header, and, where none was claimed, the role inferred from what the conversation is (``infer_role``)."""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from opengyre.events import TrajectoryRole, subject_token
from opengyre.tito import ExecutionTrajectory, Plan
from opengyre.wire import ApiError

from .._keys import ROLES, ExecutionKeys, KeyClaim

__all__ = ["ROLE_HEADER", "authorize", "infer_role", "presented_key"]

ROLE_HEADER = "x-opengyre-role"


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def authorize(request: Request, keys: ExecutionKeys, *, require_key: bool) -> tuple[str, TrajectoryRole, bool]:
    """The execution, the caller's role, and whether the role was claimed (a header, or a non-main key)."""
    path_eid = request.path_params.get("execution_id")
    if path_eid is not None:
        try:
            subject_token(path_eid)
        except ValueError:
            raise ApiError(404, "not_found", f"no execution {path_eid!r}") from None
    key = presented_key(request)
    claim: KeyClaim | None = None
    if key is None:
        if require_key:
            raise ApiError(401, "authentication", "missing API key: send Authorization: Bearer <key> or x-api-key")
    else:
        claim = keys.verify(key)
        if claim is None and require_key:
            raise ApiError(401, "authentication", "invalid API key")
    if claim is not None and path_eid is not None and claim.execution_id != path_eid:
        raise ApiError(403, "permission", "this API key belongs to another execution")
    eid = path_eid or (claim.execution_id if claim else None)
    if eid is None:
        raise ApiError(404, "not_found", "no execution: use /x/{execution_id}/v1 or an execution key")
    role: TrajectoryRole = claim.role if claim else "main"
    header = request.headers.get(ROLE_HEADER)
    if header:
        if header not in ROLES:
            raise ApiError.invalid(f"{ROLE_HEADER} must be one of {', '.join(ROLES)}")
        role = header  # type: ignore[assignment]
    return eid, role, bool(header) or role != "main"


def infer_role(traj: ExecutionTrajectory, plan: Plan) -> TrajectoryRole:
    """The role of a call whose caller did not say, from what the conversation is, not from which came first.

    A continuation takes its parent's conversation's role. A new conversation is the main agent's when it
    is under the main system prompt, else a sub-agent's (Claude Code runs its sub-agents with the same key; a
    compaction keeps the main system prompt). The main system prompt is that of the execution's first main
    conversation that has tools, else its first main one. Before any main exists, a tool-less one-shot
    helper call (a title generator: OpenCode sends it before the agent's first call) is not taken for the
    main agent; and a conversation with tools that arrives when every main so far had none is the main
    agent (the earlier one was a helper that was not recognised). A call whose last turn is a harness's
    compaction request (``_SUMMARY_PROMPT``) is the summary of the conversation it would otherwise belong to:
    ``main-summary`` or ``sub-agent-summary``.
    """
    role = _conversation_role(traj, plan)
    if plan.messages and _asks_for_summary(plan.messages):
        return "main-summary" if role == "main" else "sub-agent-summary"
    return role


def _conversation_role(traj: ExecutionTrajectory, plan: Plan) -> TrajectoryRole:
    if plan.parent_call_id is not None:
        parent = traj.nodes.get(plan.parent_call_id)
        if parent is not None and parent.role in ("sub-agent", "sub-agent-summary"):
            return "sub-agent"
        return "main"
    if not plan.messages:
        return "main"
    system = _system_of(plan.messages)
    has_tools = plan.tools_key != "[]"
    mains = [n for n in traj.nodes.values() if n.parent_node is None and n.role == "main"]
    if not mains:
        if not has_tools and system is not None and _HELPER_PROMPT.search(system):
            return "sub-agent"
        return "main"
    tooled = [n for n in mains if n.tools_key != "[]"]
    if has_tools and not tooled:
        return "main"
    ref = (tooled or mains)[0]
    return "main" if system == _system_of(ref.conv_after) else "sub-agent"


# System prompts of one-shot helper calls harnesses make beside the agent (OpenCode 1.18: "You are a title
# generator. You output ONLY a thread title."), recognised so that they are not taken for the main agent.
_HELPER_PROMPT = re.compile(r"\byou are a title generator\b|\bgenerate a (?:brief |short |concise )?title\b", re.I)


# Compaction requests real harnesses append as the conversation's last user turn (captured in
# tests/proxy/fixtures/harness_requests/*/compact-*.json): Claude Code 2.1.328 adds it to the turn that holds the
# last tool result; Codex 0.169.0 sends it alone, with no tools. Ours (opengyre.harness) claims its roles instead.
_SUMMARY_PROMPT = re.compile(
    r"\byour task is to create a detailed summary of the conversation so far\b"  # Claude Code
    r"|\byou are performing a context checkpoint compaction\b",  # Codex
    re.I,
)


def _asks_for_summary(messages: list[dict[str, Any]]) -> bool:
    last = messages[-1]
    if last.get("role") != "user":
        return False
    content = last.get("content")
    if isinstance(content, str):
        return bool(_SUMMARY_PROMPT.search(content))
    if isinstance(content, list):
        texts = (p.get("text") for p in content if isinstance(p, dict))
        return any(isinstance(t, str) and _SUMMARY_PROMPT.search(t) for t in texts)
    return False


# Claude Code's first system block is a billing line whose cc_version suffix changes with the conversation's
# first turn (after a compaction too): what the agent is, for telling conversations apart, is the rest.
_BILLING_LINE = re.compile(r"\Ax-anthropic-billing-header:[^\n]*\n?")


def _system_of(messages: list[dict[str, Any]]) -> str | None:
    if messages and messages[0].get("role") == "system":
        content = messages[0].get("content")
        return _BILLING_LINE.sub("", content) if isinstance(content, str) else None
    return None
