"""Sessions to send: synthesised from a profile with random-token fill, or replayed from a trace exactly."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._profiles import Profile, ProfileError, TraceSession, TraceTurn
from ._traces import TokenCounter

__all__ = ["SessionPlan", "TokenFill", "TurnPlan", "replay_sessions", "shadow_sessions", "synthesise_sessions"]


@dataclass(frozen=True)
class TurnPlan:
    messages: tuple[Mapping[str, Any], ...]  # appended before this turn's request
    max_tokens: int
    delay_s: float = 0.0  # waited after the previous reply before this request (tool and think time)


@dataclass(frozen=True)
class SessionPlan:
    session_id: str
    turns: tuple[TurnPlan, ...]


class TokenFill:
    """Text of an exact token count for a tokenizer, random and unique per session.

    Pieces are vocabulary entries that encode to themselves alone and stay separate when concatenated (checked
    on a long random sample), so n pieces are n tokens. Each session's text starts with pieces spelling its
    index, so no two sessions share a prefix the server could have cached.
    """

    def __init__(self, tok: TokenCounter, vocab: Sequence[str]) -> None:
        self._tok = tok
        spaced = [w for w in vocab if re.fullmatch(r" [a-z]{2,10}", w)]
        single = [w for w in vocab if re.fullmatch(r"[a-z]", w)]
        for pool in (spaced, single):
            pool = sorted(w for w in set(pool) if len(tok.encode(w, add_special_tokens=False)) == 1)
            if len(pool) >= 16 and self._stable(pool):
                self.pieces = pool
                return
        raise ProfileError("the tokenizer has no set of single-token pieces that concatenate stably")

    def _stable(self, pool: list[str]) -> bool:
        rng = random.Random(0)
        sample = rng.choices(pool, k=512)
        return len(self._tok.encode("".join(sample), add_special_tokens=False)) == 512

    @classmethod
    def for_tokenizer(cls, tok: Any) -> TokenFill:
        vocab = [tok.convert_tokens_to_string([t]) for t in tok.get_vocab()]
        return cls(tok, vocab)

    def text(self, n: int, rng: random.Random, tag: int | None = None) -> str:
        head: list[str] = []
        if tag is not None:
            base = len(self.pieces)
            head.append(self.pieces[0])  # marker, then the index's digits in base len(pieces)
            t = tag
            while True:
                head.append(self.pieces[t % base])
                t //= base
                if t == 0:
                    break
        body = rng.choices(self.pieces, k=max(0, n - len(head)))
        return "".join(head + body)


def synthesise_sessions(profile: Profile, n: int, fill: TokenFill, seed: int = 0) -> list[SessionPlan]:
    """``n`` sessions drawn from the profile; a shared prefix (when the profile has one) is a system message
    common to all sessions, like an agent's fixed system prompt; everything else is unique per session."""
    if n <= 0:
        raise ProfileError(f"the number of sessions must be positive, got {n}")
    shared: tuple[Mapping[str, Any], ...] = ()
    if profile.shared_prefix > 0:
        shared = ({"role": "system", "content": fill.text(profile.shared_prefix, random.Random(f"{seed}-prefix"))},)
    out: list[SessionPlan] = []
    g = profile.group_size
    for i in range(n):
        rng = random.Random(f"{seed}-{i}")
        # its own stream: a profile with tool latency sends the same sessions as the same profile without
        tool_rng = random.Random(f"{seed}-{i}-tool")
        # a group's sessions draw their first prompt from one stream: the same text (tagged by the group)
        first_rng, tag = (rng, i) if g == 1 else (random.Random(f"{seed}-group-{i // g}"), i // g)
        turns: list[TurnPlan] = []
        for k in range(profile.turns.sample(rng)):
            if k == 0:
                msg = {"role": "user", "content": fill.text(profile.first_prompt.sample(first_rng), first_rng, tag=tag)}
                msgs = (*shared, msg)
            else:
                msgs = ({"role": "user", "content": fill.text(profile.observation_at(k + 1).sample(rng), rng)},)
            delay = profile.tool_latency.sample(tool_rng) if k > 0 and profile.tool_latency else 0.0
            turns.append(TurnPlan(msgs, profile.output_at(k + 1).sample(rng), delay))
        out.append(SessionPlan(f"s{seed}-{i}", tuple(turns)))
    return out


def _recorded_delay(t: TraceTurn) -> float:
    """The trace's gap before a turn: it includes the recorded request's own generation time, which the replay
    spends again on the server, so it is an upper bound on the tool and think time."""
    return t.delay_s or 0.0


def replay_sessions(sessions: Sequence[TraceSession]) -> list[SessionPlan]:
    """The recorded requests exactly (their messages; the reply length recorded); needs a trace with text."""
    out: list[SessionPlan] = []
    for s in sessions:
        if any(not t.messages for t in s.turns):
            raise ProfileError(f"trace session {s.session_id!r} has token counts only: it cannot be replayed exactly")
        out.append(
            SessionPlan(s.session_id, tuple(TurnPlan(t.messages, t.output_tokens, _recorded_delay(t)) for t in s.turns))
        )
    return out


def shadow_sessions(sessions: Sequence[TraceSession], fill: TokenFill, seed: int = 0) -> list[SessionPlan]:
    """The trace's sessions with every message replaced by random tokens of the same count (same lengths,
    other content; a shared prefix stays one text common to all sessions): with ``replay_sessions`` it isolates
    whether token content changes the server's timing."""
    prefixes: dict[int, tuple[Mapping[str, Any], ...]] = {}
    # sessions whose first request is the same (a group of rollouts of one task) get the same random text for it
    firsts: dict[str, tuple[Mapping[str, Any], ...]] = {}
    out: list[SessionPlan] = []
    for i, s in enumerate(sessions):
        rng = random.Random(f"shadow-{seed}-{i}")
        if s.shared_prefix and s.shared_prefix not in prefixes:
            text = fill.text(s.shared_prefix, random.Random(f"shadow-{seed}-prefix"))
            prefixes[s.shared_prefix] = ({"role": "system", "content": text},)
        shared = prefixes.get(s.shared_prefix, ())
        key = repr([(m.get("role"), m.get("content")) for m in s.turns[0].messages]) if s.turns[0].messages else ""
        turns: list[TurnPlan] = []
        for k, t in enumerate(s.turns):
            if k == 0 and key in firsts:
                msgs = firsts[key]
            elif k == 0:
                msgs = (*shared, {"role": "user", "content": fill.text(t.new_tokens, rng, tag=i)})
                if key:
                    firsts[key] = msgs
            else:
                msgs = ({"role": "user", "content": fill.text(t.new_tokens, rng)},)
            turns.append(TurnPlan(msgs, t.output_tokens, _recorded_delay(t)))
        out.append(SessionPlan(f"shadow-{s.session_id}", tuple(turns)))
    return out
