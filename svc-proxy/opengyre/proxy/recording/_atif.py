"""Export recorded trajectories as ATIF (Agent Trajectory Interchange Format, Harbor's ``ATIF-v1.7``).

One ATIF trajectory per root-to-leaf path: the steps are the leaf's conversation (rebuilt from the context
deltas the calls carried), and every agent step produced by a recorded call carries its exact prompt and
completion token ids and behaviour logprobs. An execution exports as its main path, with the other paths
(sub-agents, compactions, retries) as ``subagent_trajectories``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opengyre.events import ModelCallRecorded
from opengyre.tito import canon_message
from opengyre.trajectory import TrajectoryTree
from opengyre.wire import arguments_object

from ._trees import StoredCall

__all__ = ["ATIF_VERSION", "context_of", "conversations", "export_execution", "export_path"]

ATIF_VERSION = "ATIF-v1.7"
AGENT = {"name": "opengyre-proxy", "version": "0.1.0"}

Message = dict[str, Any]


def context_of(e: ModelCallRecorded, contexts: Mapping[str, dict[str, Any]] | None) -> dict[str, Any]:
    """A call's conditioning context: inline in its event, or fetched from the object store (``contexts``)."""
    resolved = contexts.get(e.call_id) if contexts else None
    return resolved if resolved is not None else e.context or {}


def conversations(
    calls: Sequence[StoredCall], contexts: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, list[Message]]:
    """Each call's request messages, rebuilt from the context deltas (``contexts`` resolves out-of-band ones)."""
    by_id = {c.event.call_id: c.event for c in calls}
    out: dict[str, list[Message]] = {}
    for c in calls:  # log order: parents first
        e = c.event
        context = context_of(e, contexts)
        base: list[Message] = []
        if e.parent_call_id is not None and e.parent_call_id in out:
            p = by_id[e.parent_call_id]
            resp = context_of(p, contexts).get("response")
            base = out[e.parent_call_id] + ([resp] if resp else [])
        out[e.call_id] = base[: int(context.get("base", 0))] + list(context.get("messages", []))
    return out


def export_path(
    tree: TrajectoryTree,
    calls: Sequence[StoredCall],
    leaf: str,
    *,
    contexts: Mapping[str, dict[str, Any]] | None = None,
    convs: Mapping[str, list[Message]] | None = None,
) -> dict[str, Any]:
    by_id = {c.event.call_id: c.event for c in calls}
    convs = convs if convs is not None else conversations(calls, contexts)
    leaf_e = by_id[leaf]
    leaf_ctx = context_of(leaf_e, contexts)
    conv = list(convs.get(leaf, []))
    if leaf_ctx.get("response"):
        conv.append(leaf_ctx["response"])
    # Which assistant turn each call on the path produced: the message right after its request.
    producer: dict[int, ModelCallRecorded] = {}
    for cid in tree.path(leaf):
        e = by_id[cid]
        i = len(convs.get(cid, []))
        resp = context_of(e, contexts).get("response")
        if resp is not None and i < len(conv) and canon_message(conv[i]) == canon_message(resp):
            producer[i] = e
    steps: list[dict[str, Any]] = []
    totals = {"prompt": 0, "completion": 0}

    def add(step: dict[str, Any]) -> dict[str, Any]:
        step["step_id"] = len(steps) + 1
        steps.append(step)
        return step

    last_agent: dict[str, Any] | None = None
    for i, m in enumerate(conv):
        role = m.get("role")
        content = m.get("content") or ""
        if role == "system":
            add({"source": "system", "message": content})
        elif role == "user":
            add({"source": "user", "message": content})
        elif role == "tool" and last_agent is not None:
            result: dict[str, Any] = {"content": content}
            ids = {t["tool_call_id"] for t in last_agent.get("tool_calls", [])}
            if m.get("tool_call_id") in ids:
                result["source_call_id"] = m["tool_call_id"]
            last_agent.setdefault("observation", {"results": []})["results"].append(result)
        elif role == "tool":
            add({"source": "user", "message": content})
        elif role == "assistant":
            step: dict[str, Any] = {"source": "agent", "message": content}
            if m.get("tool_calls"):
                step["tool_calls"] = [
                    {
                        "tool_call_id": tc.get("id", ""),
                        "function_name": tc["function"]["name"],
                        "arguments": arguments_object(tc["function"].get("arguments", "")),
                    }
                    for tc in m["tool_calls"]
                ]
            made_by = producer.get(i)
            if made_by is None:
                step["is_copied_context"] = True  # the harness wrote or rewrote this turn: not a policy sample
                step["llm_call_count"] = 0
            else:
                e = made_by
                prompt = tree.prompt(e.call_id)
                step["timestamp"] = e.occurred_at.isoformat().replace("+00:00", "Z")
                step["model_name"] = e.model
                step["llm_call_count"] = 1
                step["metrics"] = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(e.output_ids),
                    "prompt_token_ids": list(prompt),
                    "completion_token_ids": list(e.output_ids),
                    "logprobs": list(e.output_logprobs),
                    "extra": {
                        "call_id": e.call_id,
                        "weight_version": e.weight_version,
                        "engine_id": e.engine_id,
                        "branch": e.branch,
                        "drift": e.drift.kind if e.drift else None,
                    },
                }
                totals["prompt"] += len(prompt)
                totals["completion"] += len(e.output_ids)
            last_agent = add(step)
    if not steps:  # a completions-style call without messages: prompt text and the tokens
        add({"source": "user", "message": str(leaf_ctx.get("prompt_text", ""))})
        prompt = tree.prompt(leaf)
        add(
            {
                "source": "agent",
                "message": "",
                "model_name": leaf_e.model,
                "llm_call_count": 1,
                "metrics": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(leaf_e.output_ids),
                    "prompt_token_ids": list(prompt),
                    "completion_token_ids": list(leaf_e.output_ids),
                    "logprobs": list(leaf_e.output_logprobs),
                },
            }
        )
        totals["prompt"] += len(prompt)
        totals["completion"] += len(leaf_e.output_ids)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": tree.execution_id,
        "trajectory_id": f"{tree.execution_id}/{leaf}",
        "agent": {**AGENT, "model_name": leaf_e.model},
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": totals["prompt"],
            "total_completion_tokens": totals["completion"],
            "total_steps": len(steps),
        },
        "extra": {"role": leaf_e.role, "leaf_call_id": leaf, "calls": list(tree.path(leaf))},
    }


def export_execution(
    tree: TrajectoryTree, calls: Sequence[StoredCall], *, contexts: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The main path (the longest main-role leaf, else the longest leaf) with every other path embedded."""
    leaves = tree.leaves()
    if not leaves:
        raise ValueError(f"execution {tree.execution_id} has no recorded calls")
    convs = conversations(calls, contexts)
    rank = {"main": 0, "main-summary": 1, "sub-agent": 2, "sub-agent-summary": 3}
    main = min(leaves, key=lambda c: (rank.get(tree.node(c).role, 9), -tree.length(c)))
    top = export_path(tree, calls, main, contexts=contexts, convs=convs)
    others = [export_path(tree, calls, c, contexts=contexts, convs=convs) for c in leaves if c != main]
    if others:
        top["subagent_trajectories"] = others
    return top
