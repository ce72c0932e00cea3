"""Token-in/token-out prompt building for one execution: extension, retry, rewrite, and drift.

The harness sends messages; the engine must see tokens. When a request's messages are the previous
conversation (request + the reply we gave) plus new turns, the prompt is that call's prompt + output token
ids plus only the new turns rendered, so the policy is conditioned on exactly the tokens it produced, whatever
the template or the harness would re-render. Re-rendering from scratch is still done, to *detect* drift (and
count and store it), never to replace the recorded tokens. A request that repeats an earlier request exactly
is a retry (a sibling of that call, same prompt tokens); anything else rewrote history (compaction, edited
tool output, a sub-agent) and starts a branch at the longest shared token prefix, or a new root.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from opengyre.chat import ChatCodec
from opengyre.events import DriftReport, TrajectoryRole

__all__ = ["ExecutionTrajectory", "Plan", "TitoNode", "canon_message", "tools_key"]

Message = dict[str, Any]


def _canon_args(args: str) -> object:
    try:
        return json.loads(args)
    except ValueError:
        return args


def canon_message(m: Message) -> str:
    """What makes two messages the same turn for the model (tool arguments compared as JSON values)."""
    calls = [
        [tc.get("id", ""), tc["function"]["name"], _canon_args(tc["function"].get("arguments", ""))]
        for tc in m.get("tool_calls") or []
    ]
    return json.dumps(
        [m.get("role"), m.get("content") or "", calls, m.get("tool_call_id") or ""],
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )


def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    return json.dumps(list(tools or []), sort_keys=True, separators=(",", ":"))


def _chain(tools_key: str, messages: Sequence[Message]) -> list[bytes]:
    """Hashes of every message prefix (index i covers messages[:i]), tools included."""
    h = hashlib.sha256(tools_key.encode()).digest()
    out = [h]
    for m in messages:
        h = _link(h, m)
        out.append(h)
    return out


def _link(h: bytes, m: Message) -> bytes:
    """The chain hash of a prefix whose hash is ``h``, one message longer."""
    return hashlib.sha256(h + canon_message(m).encode()).digest()


def _lcp(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return n if diff.size == 0 else int(diff[0])


@dataclass(frozen=True, slots=True)
class Plan:
    prompt_ids: list[int]
    parent_call_id: str | None
    prefix_len: int
    delta_ids: list[int]
    branch: str  # root | extension | retry | rewrite
    drift: DriftReport | None
    context: dict[str, Any]  # the conditioning context, as a delta against the parent's conversation
    messages: list[Message] | None
    tools_key: str
    # The chain hash of ``messages`` (tools included) as planned: commit extends it by the reply instead of hashing
    # the whole conversation again. None (a plan made elsewhere, e.g. a restore): commit hashes it.
    request_hash: bytes | None = None


_EMPTY = np.zeros(0, dtype=np.int32)


@dataclass(eq=False)
class TitoNode:
    """One recorded call, stored as the tree stores it: its token delta and output, not the whole prefix.

    An XLong execution has hundreds of calls over a context of up to ~1M tokens: keeping every call's full
    prompt would hold the flat size in memory; full sequences are rebuilt on demand (and the last few cached).
    """

    call_id: str
    parent_node: TitoNode | None
    prefix_len: int
    delta: np.ndarray[Any, Any]  # int32
    out: np.ndarray[Any, Any]  # int32
    role: TrajectoryRole
    conv_after: list[Message]
    tools_key: str
    _cache: np.ndarray[Any, Any] | None = field(default=None, repr=False)

    @property
    def parent(self) -> str | None:
        return self.parent_node.call_id if self.parent_node is not None else None

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + len(self.delta)

    @property
    def n_tokens(self) -> int:
        return self.prompt_len + len(self.out)

    @property
    def last_output(self) -> int | None:
        return int(self.out[-1]) if len(self.out) else None

    def token_array(self) -> np.ndarray[Any, Any]:
        """Prompt followed by output (built from the deltas up the tree, iteratively: chains can be long)."""
        if self._cache is not None:
            return self._cache
        chain: list[TitoNode] = []
        cur: TitoNode | None = self
        while cur is not None and cur._cache is None:
            chain.append(cur)
            cur = cur.parent_node
        base = cur._cache if cur is not None and cur._cache is not None else _EMPTY
        for n in reversed(chain):
            base = np.concatenate([base[: n.prefix_len] if n.parent_node is not None else _EMPTY, n.delta, n.out])
        return base

    @property
    def prompt(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.token_array()[: self.prompt_len])

    @property
    def output(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.out)


class ExecutionTrajectory:
    """The live TITO state of one execution (the recorded tree is the projection's; this mirrors it)."""

    def __init__(self, execution_id: str, codec: ChatCodec) -> None:
        self.execution_id = execution_id
        self.codec = codec
        self.nodes: dict[str, TitoNode] = {}
        self._by_conv: dict[bytes, str] = {}
        self._by_req: dict[bytes, str] = {}
        self._cached: list[TitoNode] = []  # nodes holding a materialised token array (the most recent few)
        self.drift_count = 0
        self.branches: dict[str, int] = {"root": 0, "extension": 0, "retry": 0, "rewrite": 0}

    # --- planning ---------------------------------------------------------------------------------------

    def plan(self, messages: list[Message], tools: Sequence[dict[str, Any]] | None) -> Plan:
        tk = tools_key(tools)
        hashes = _chain(tk, messages)
        same = self._by_req.get(hashes[-1])
        if same is not None:  # a retry reuses that request's tokens: nothing to render
            return replace(self._retry(self.nodes[same], messages, tools, tk), request_hash=hashes[-1])
        full_text = self.codec.render(messages, tools, gen=True)
        fresh = self.codec.encode(full_text)
        # The longest history that ends with one of our replies verbatim (extend that call's tokens), and the
        # longest that is an earlier request (reuse its prompt tokens, then render what the harness changed).
        conv_i, conv_node = 0, None
        for i in range(len(messages), 0, -1):
            if (cid := self._by_conv.get(hashes[i])) is not None:
                conv_i, conv_node = i, self.nodes[cid]
                break
        req_j, req_node = 0, None
        for j in range(len(messages) - 1, 0, -1):
            if (cid := self._by_req.get(hashes[j])) is not None:
                req_j, req_node = j, self.nodes[cid]
                break
        plan: Plan | None = None
        if conv_node is not None and conv_i >= req_j:
            plan = self._extend(conv_node, messages, tools, tk, conv_i, full_text, fresh)
        if plan is None and req_node is not None:
            plan = self._fork_request(req_node, messages, tools, tk, req_j, full_text, fresh)
        if plan is None and conv_node is not None and conv_i < req_j:  # the request match did not render as a prefix
            plan = self._extend(conv_node, messages, tools, tk, conv_i, full_text, fresh)
        if plan is None:
            plan = self._branch(fresh, messages, tools, tk)
        return replace(plan, request_hash=hashes[-1])

    @staticmethod
    def _drift(prompt: list[int], fresh: list[int]) -> DriftReport | None:
        if prompt == fresh:
            return None
        at = _lcp(np.asarray(prompt), np.asarray(fresh))
        return DriftReport(
            kind="retokenization",
            position=at,
            detail=f"recorded {prompt[at : at + 8]} vs re-rendered {fresh[at : at + 8]} "
            f"({len(prompt)} vs {len(fresh)} tokens)",
        )

    def _fork_request(
        self,
        x: TitoNode,
        messages: list[Message],
        tools: Sequence[dict[str, Any]] | None,
        tk: str,
        j: int,
        full_text: str,
        fresh: list[int],
    ) -> Plan | None:
        """The history starts with an earlier request but not with its reply (the harness edited the reply):
        keep that request's exact prompt tokens and render the rest; a sibling of that call."""
        prefix_text = self.codec.render(messages[:j], tools, gen=True)
        if not full_text.startswith(prefix_text):
            return None
        prompt = self._tokens(x)[: x.prompt_len].tolist() + self.codec.encode(full_text[len(prefix_text) :])
        parent, shared = self._walk_up(x, x.prompt_len)
        return Plan(
            prompt_ids=prompt,
            parent_call_id=parent.call_id if parent else None,
            prefix_len=shared,
            delta_ids=prompt[shared:],
            branch="rewrite",
            drift=self._drift(prompt, fresh),
            context=self._context(parent, messages, tools, tk),
            messages=messages,
            tools_key=tk,
        )

    def plan_tokens(self, prompt_ids: list[int]) -> Plan:
        """A completions-style prompt given (or rendered) as tokens: attach at the longest shared prefix."""
        return self._branch(prompt_ids, None, None, "")

    def _context(
        self,
        parent: TitoNode | None,
        messages: list[Message],
        tools: Sequence[dict[str, Any]] | None,
        tk: str,
        *,
        shared: int | None = None,
    ) -> dict[str, Any]:
        """``shared``: how many leading messages are known to be the parent's conversation (an extension: its chain
        hash matched), so they are not compared again one by one."""
        base = 0
        if shared is not None:
            base = shared
        elif parent is not None:
            for a, b in zip(parent.conv_after, messages, strict=False):
                if a is not b and canon_message(a) != canon_message(b):
                    break
                base += 1
        ctx: dict[str, Any] = {"base": base, "messages": messages[base:]}
        if parent is None or parent.tools_key != tk:
            ctx["tools"] = list(tools or [])
        return ctx

    def _extend(
        self,
        p: TitoNode,
        messages: list[Message],
        tools: Sequence[dict[str, Any]] | None,
        tk: str,
        i: int,
        full_text: str,
        fresh: list[int],
    ) -> Plan | None:
        prefix_text = self.codec.render(messages[:i], tools, gen=False)
        if not full_text.startswith(prefix_text):
            return None  # the template rewrote earlier turns: not an append-only extension
        eos = self.codec.eos_id
        bridge = list(self.codec.turn_close_ids)
        if p.last_output != eos:
            bridge = [eos, *bridge]  # the turn ended without eos (length, stop string): close it as the template does
        delta = bridge + self.codec.encode(full_text[len(prefix_text) :])
        prompt = self._tokens(p).tolist() + delta
        drift = self._drift(prompt, fresh)
        return Plan(
            prompt_ids=prompt,
            parent_call_id=p.call_id,
            prefix_len=p.n_tokens,
            delta_ids=delta,
            branch="extension",
            drift=drift,
            # messages[:i] hash to p's whole conversation (how p was found): all i are p's, in order.
            context=self._context(p, messages, tools, tk, shared=i),
            messages=messages,
            tools_key=tk,
        )

    def _tokens(self, node: TitoNode) -> np.ndarray[Any, Any]:
        """A node's full token array, keeping the most recent few materialised (extensions reuse them)."""
        arr = node.token_array()
        if node._cache is None:
            node._cache = arr
            self._cached.append(node)
            while len(self._cached) > 4:
                self._cached.pop(0)._cache = None
        return arr

    def _attach(self, prompt: list[int]) -> tuple[TitoNode | None, int]:
        """Where a prompt forks off the tree: the node and the shared length, never inside a node's prompt
        when its parent could hold the fork (so earlier calls stay leaves of their own paths).

        The shared length with every node comes from its parent's: only each node's own delta and output are
        compared, so a scan costs the tree's size, not the flat size.
        """
        if not self.nodes:
            return None, 0
        x = np.asarray(prompt, dtype=np.int64)
        shared_with: dict[str, int] = {}
        best: TitoNode | None = None
        shared = 0
        for n in self.nodes.values():  # parents come before their children
            k = n.prefix_len
            if n.parent_node is not None and shared_with[n.parent_node.call_id] < k:
                lcp = shared_with[n.parent_node.call_id]
            else:
                k = k if n.parent_node is not None else 0
                own = np.concatenate([n.delta, n.out])
                lcp = k + _lcp(own, x[k:])
            shared_with[n.call_id] = lcp
            if lcp > shared:
                best, shared = n, lcp
        if best is None:
            return None, 0
        return self._walk_up(best, shared)

    def _walk_up(self, node: TitoNode, shared: int) -> tuple[TitoNode | None, int]:
        """Move a fork that lies inside a node's prompt up to its parent, so the node stays a leaf of its own."""
        cur: TitoNode | None = node
        while cur is not None and shared <= cur.prompt_len:
            shared = min(shared, cur.prefix_len)
            cur = cur.parent_node
        if cur is None:
            return None, 0
        return cur, shared

    def _retry(self, x: TitoNode, messages: list[Message], tools: Sequence[dict[str, Any]] | None, tk: str) -> Plan:
        prompt = self._tokens(x)[: x.prompt_len].tolist()
        parent = x.parent_node
        prefix = x.prefix_len if parent is not None else 0
        return Plan(
            prompt_ids=prompt,
            parent_call_id=x.parent,
            prefix_len=prefix,
            delta_ids=prompt[prefix:],
            branch="retry",
            drift=None,
            context=self._context(parent, messages, tools, tk),
            messages=messages,
            tools_key=tk,
        )

    def _branch(
        self, prompt: list[int], messages: list[Message] | None, tools: Sequence[dict[str, Any]] | None, tk: str
    ) -> Plan:
        parent, shared = self._attach(prompt)
        ctx = self._context(parent, messages, tools, tk) if messages is not None else {}
        branch = "root" if parent is None else "rewrite"
        if parent is not None and shared == parent.n_tokens and messages is None:
            branch = "extension"
        return Plan(
            prompt_ids=prompt,
            parent_call_id=parent.call_id if parent else None,
            prefix_len=shared,
            delta_ids=prompt[shared:],
            branch=branch,
            drift=None,
            context=ctx,
            messages=messages,
            tools_key=tk,
        )

    # --- after the call ---------------------------------------------------------------------------------

    def commit(
        self, plan: Plan, call_id: str, output_ids: Sequence[int], response: Message | None, role: TrajectoryRole
    ) -> TitoNode:
        conv = list(plan.messages or [])
        parent = self.nodes[plan.parent_call_id] if plan.parent_call_id is not None else None
        node = TitoNode(
            call_id=call_id,
            parent_node=parent,
            prefix_len=plan.prefix_len,
            delta=np.asarray(plan.delta_ids, dtype=np.int32),
            out=np.asarray(list(output_ids), dtype=np.int32),
            role=role,
            conv_after=[*conv, response] if response is not None else conv,
            tools_key=plan.tools_key,
        )
        self.nodes[call_id] = node
        if plan.messages is not None and response is not None:
            request = plan.request_hash or _chain(plan.tools_key, conv)[-1]
            self._by_req.setdefault(request, call_id)
            self._by_conv[_link(request, response)] = call_id
        self.branches[plan.branch] = self.branches.get(plan.branch, 0) + 1
        if plan.drift is not None:
            self.drift_count += 1
        return node
