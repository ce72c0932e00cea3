"""Read recorded sessions from ATIF trajectories, ShareGPT JSON and OpenGyre's recorded model calls."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from ._profiles import ProfileError, TraceSession, TraceTurn

__all__ = ["TokenCounter", "calls_sessions", "read_trace", "trace_formats"]


class TokenCounter(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def _text(content: Any, where: str = "message") -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    raise ProfileError(f"{where}: content must be text or a list of parts, got {type(content).__name__}")


def _count(tok: TokenCounter, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def _sharegpt(doc: Any, tok: TokenCounter) -> list[TraceSession]:
    if not isinstance(doc, list):
        raise ProfileError("ShareGPT: expected a JSON list of conversations")
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
    out: list[TraceSession] = []
    for n, conv in enumerate(doc):
        msgs = conv.get("conversations") if isinstance(conv, Mapping) else None
        if not isinstance(msgs, list):
            raise ProfileError(f"ShareGPT conversation {n}: no 'conversations' list")
        sid = str(conv.get("id", n))
        turns: list[TraceTurn] = []
        pending: list[dict[str, Any]] = []
        for i, m in enumerate(msgs):
            if not isinstance(m, Mapping) or m.get("from") not in roles or not isinstance(m.get("value"), str):
                raise ProfileError(
                    f"ShareGPT conversation {sid!r} message {i}: needs 'from' in {sorted(roles)} and 'value'"
                )
            role = roles[str(m["from"])]
            if role == "assistant":
                if not pending:
                    raise ProfileError(f"ShareGPT conversation {sid!r} message {i}: a reply with no request before it")
                new = sum(_count(tok, str(p["content"])) for p in pending)
                turns.append(TraceTurn(new, max(1, _count(tok, str(m["value"]))), tuple(pending)))
                pending = []
            else:
                pending.append({"role": role, "content": m["value"]})
        if turns:
            out.append(TraceSession(sid, tuple(turns)))
    return out


def _atif(doc: Any, tok: TokenCounter) -> list[TraceSession]:
    docs = doc if isinstance(doc, list) else [doc]
    out: list[TraceSession] = []
    for n, traj in enumerate(docs):
        if not isinstance(traj, Mapping) or not str(traj.get("schema_version", "")).startswith("ATIF-"):
            raise ProfileError(f"ATIF trajectory {n}: no schema_version 'ATIF-v1.x'")
        steps = traj.get("steps")
        if not isinstance(steps, list) or not steps:
            raise ProfileError(f"ATIF trajectory {n}: 'steps' must be a non-empty list")
        sid = str(traj.get("session_id") or traj.get("trajectory_id") or n)
        turns: list[TraceTurn] = []
        pending: list[dict[str, Any]] = []
        last_agent: float | None = None  # the previous agent step's timestamp (s)
        for i, st in enumerate(steps):
            where = f"ATIF {sid!r} step {i + 1}"
            if not isinstance(st, Mapping) or st.get("source") not in ("system", "user", "agent"):
                raise ProfileError(f"{where}: 'source' must be system, user or agent")
            when = _timestamp(st.get("timestamp"), where)
            if st["source"] != "agent":
                pending.append({"role": st["source"], "content": _text(st.get("message"), f"{where} message")})
                continue
            metrics = st.get("metrics")
            if metrics is None:
                metrics = {}
            if not isinstance(metrics, Mapping):
                raise ProfileError(f"{where}: 'metrics' must be an object, got {type(metrics).__name__}")
            reply = _text(st.get("message"), f"{where} message")
            recorded = metrics.get("completion_tokens")
            if recorded is not None and (isinstance(recorded, bool) or not isinstance(recorded, int) or recorded <= 0):
                raise ProfileError(f"{where}: metrics.completion_tokens must be a positive integer, got {recorded!r}")
            out_tokens = recorded if recorded is not None else (_count(tok, reply) or 1)
            new = sum(_count(tok, str(p["content"])) for p in pending)
            if not pending:
                raise ProfileError(f"{where}: an agent step with nothing new before it")
            delay: float | None = None
            if when is not None and last_agent is not None:
                if when < last_agent:
                    raise ProfileError(f"{where}: its timestamp is before the previous agent step's")
                delay = when - last_agent
            last_agent = when
            turns.append(TraceTurn(max(1, new), out_tokens, tuple(pending), delay_s=delay))
            pending = []
            obs = st.get("observation")
            if obs is None:
                continue
            if not isinstance(obs, Mapping):
                raise ProfileError(f"{where}: 'observation' must be an object, got {type(obs).__name__}")
            results = obs.get("results")
            if results is None:
                continue
            if not isinstance(results, list):
                raise ProfileError(
                    f"{where}: observation.results must be a list of results, got {type(results).__name__}"
                )
            for j, r in enumerate(results):
                content = _text(r.get("content") if isinstance(r, Mapping) else r, f"{where} observation.results[{j}]")
                pending.append({"role": "user", "content": content})
        if turns:
            out.append(TraceSession(sid, tuple(turns)))
    return out


def _timestamp(value: Any, where: str) -> float | None:
    """An ISO 8601 timestamp as POSIX seconds (None when absent); a zone-less one is taken as UTC."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProfileError(f"{where}: timestamp must be an ISO 8601 string, got {value!r}")
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ProfileError(f"{where}: timestamp {value!r} is not ISO 8601") from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


_FORMATS: dict[str, Callable[[Any, TokenCounter], list[TraceSession]]] = {"sharegpt": _sharegpt, "atif": _atif}


def trace_formats() -> Sequence[str]:
    return tuple(_FORMATS)


def read_trace(doc: Any, fmt: str, tok: TokenCounter) -> list[TraceSession]:
    """Sessions of a parsed JSON trace; a clear ``ProfileError`` naming the bad record otherwise."""
    try:
        reader = _FORMATS[fmt]
    except KeyError:
        raise ProfileError(f"unknown trace format {fmt!r}; known: {', '.join(_FORMATS)}") from None
    sessions = reader(doc, tok)
    if not sessions:
        raise ProfileError(f"the {fmt} trace holds no request with a reply")
    return _shared_prefix(sessions, tok)


def _shared_prefix(sessions: list[TraceSession], tok: TokenCounter) -> list[TraceSession]:
    """Leading messages every session starts with (an agent's system prompt, its tool list) are the trace's
    shared prefix: counted once as ``shared_prefix`` and taken out of the first turn's new tokens, so the
    synthetic form sends one common prefix too and a server's prefix cache sees the structure the replay has."""
    if len(sessions) < 2:
        return sessions
    firsts = [s.turns[0].messages for s in sessions]
    n = 0
    # stop before a session's last first-turn message: its first request must still send something of its own
    while all(len(m) > n + 1 and m[n] == firsts[0][n] for m in firsts):
        n += 1
    if n == 0:
        return sessions
    shared = sum(_count(tok, _text(m.get("content"))) for m in firsts[0][:n])
    return [
        replace(
            s,
            shared_prefix=shared,
            turns=(replace(s.turns[0], new_tokens=max(1, s.turns[0].new_tokens - shared)), *s.turns[1:]),
        )
        for s in sessions
    ]


def calls_sessions(calls: Iterable[Any]) -> list[TraceSession]:
    """Sessions of OpenGyre's recorded model calls (``ModelCallRecorded``, main role), one per execution.

    A call's new tokens are its prompt beyond what its parent's prompt and output already held; counts only
    (the store keeps token ids, not messages), so these profiles replay in synthesised form.
    """
    by_exec: dict[str, list[Any]] = {}
    for c in calls:
        if getattr(c, "role", "main") == "main":
            by_exec.setdefault(c.execution_id, []).append(c)
    out: list[TraceSession] = []
    for ex, cs in by_exec.items():
        prompt_len: dict[str, int] = {}
        out_len: dict[str, int] = {}
        turns: list[TraceTurn] = []
        for c in cs:
            plen = c.prefix_len + len(c.prompt_delta_ids)
            prompt_len[c.call_id], out_len[c.call_id] = plen, len(c.output_ids)
            parent = c.parent_call_id
            base = prompt_len[parent] + out_len[parent] if parent in prompt_len else 0
            new = plen - min(base, c.prefix_len) if parent in prompt_len else plen
            if len(c.output_ids) > 0 and new > 0:
                turns.append(TraceTurn(new, len(c.output_ids)))
        if turns:
            out.append(TraceSession(ex, tuple(turns)))
    return out
