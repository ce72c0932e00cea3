"""Workload profiles: per-turn length distributions, fitted from traces, and the paper's five typical ones.

A session's first request carries ``first_prompt`` tokens (after a ``shared_prefix`` common to all sessions, if
the profile has one); each later turn appends the server's real reply and an observation of ``observation``
tokens, so turn k's input is the whole conversation so far (the snowball). ``output`` is each turn's reply length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "PAPER_PROFILES",
    "DelayDist",
    "LengthDist",
    "Profile",
    "ProfileError",
    "TraceSession",
    "TraceTurn",
    "fit_profile",
    "fit_replies",
    "paper_profile",
]

# Dispersion of the built-in profiles' lognormal lengths: the paper publishes means only, so this is an assumption
# (reported with every run through ``Profile.source``), not a fitted value.
ASSUMED_SIGMA = 0.5
ASSUMED_TURN_SIGMA = 0.3


class ProfileError(ValueError):
    """A profile or trace that cannot be used, with what is wrong and where."""


_KINDS = ("constant", "lognormal", "empirical")


@dataclass(frozen=True)
class LengthDist:
    """A positive integer length: constant, lognormal (by its mean and the sigma of its log) or empirical."""

    kind: str
    mean: float
    sigma: float = 0.0
    values: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ProfileError(f"length kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.kind == "empirical":
            if not self.values or any(v <= 0 for v in self.values):
                raise ProfileError("an empirical length needs positive values")
        elif not (math.isfinite(self.mean) and self.mean > 0):
            raise ProfileError(f"a length's mean must be positive, got {self.mean!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ProfileError(f"sigma must be >= 0, got {self.sigma!r}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "constant" or (self.kind == "lognormal" and self.sigma == 0):
            return max(1, round(self.mean))
        if self.kind == "empirical":
            return rng.choice(self.values)
        mu = math.log(self.mean) - self.sigma**2 / 2
        return max(1, round(rng.lognormvariate(mu, self.sigma)))

    def second_moment(self) -> float:
        if self.kind == "empirical":
            return sum(v * v for v in self.values) / len(self.values)
        if self.kind == "lognormal":
            return self.mean**2 * math.exp(self.sigma**2)
        return self.mean**2

    def scaled(self, factor: float) -> LengthDist:
        if self.kind == "empirical":
            return replace(self, values=tuple(max(1, round(v * factor)) for v in self.values), mean=self.mean * factor)
        return replace(self, mean=max(1.0, self.mean * factor))

    @classmethod
    def fit(cls, values: Sequence[int]) -> LengthDist:
        """Lognormal with the values' arithmetic mean and coefficient of variation (method of moments); constant
        when all values agree.

        Moments, not maximum likelihood on the logs: the mean length is what a run's load follows (a turn's
        prefill and the context every later turn carries), and recorded lengths are often not lognormal (cut at
        a limit, clustered), where the likelihood fit keeps the geometric mean and misstates the arithmetic one
        (by 3 % on the docs trace of the replay benchmark, 2 % on its first prompts).
        """
        vals = [int(v) for v in values if v > 0]
        if not vals:
            raise ProfileError("no positive lengths to fit")
        if len(set(vals)) == 1:
            return cls("constant", float(vals[0]))
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / len(vals)
        return cls("lognormal", mean, math.sqrt(math.log1p(var / mean**2)))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "mean": self.mean}
        if self.kind == "lognormal":
            d["sigma"] = self.sigma
        if self.kind == "empirical":
            d["values"] = list(self.values)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LengthDist:
        if not isinstance(d, Mapping):
            raise ProfileError(f"{where}: expected an object with kind and mean, got {d!r}")
        unknown = set(d) - {"kind", "mean", "sigma", "values"}
        if unknown:
            raise ProfileError(f"{where}: unknown keys {sorted(unknown)}")
        if "kind" not in d:
            raise ProfileError(f"{where}: missing kind")
        raw = d.get("values", [])
        if not isinstance(raw, list):
            raise ProfileError(f"{where}: values must be a list of whole numbers, got {raw!r}")
        values = tuple(_whole(v, f"{where}.values[{i}]") for i, v in enumerate(raw))
        mean = (
            _number(d["mean"], f"{where}.mean") if "mean" in d else (sum(values) / len(values) if values else math.nan)
        )
        sigma = _number(d.get("sigma", 0.0), f"{where}.sigma")
        try:
            return cls(str(d["kind"]), mean, sigma, values)
        except ProfileError as e:
            raise ProfileError(f"{where}: {e}") from None


@dataclass(frozen=True)
class DelayDist:
    """Seconds between a reply and the session's next request: the agent's tool calls and its own think time.

    Constant, lognormal (by its mean and the sigma of its log) or empirical (recorded gaps, zeros allowed)."""

    kind: str
    mean: float
    sigma: float = 0.0
    values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ProfileError(f"tool_latency kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.kind == "empirical" and (
            not self.values or any(not (math.isfinite(v) and v >= 0) for v in self.values)
        ):
            raise ProfileError("an empirical tool_latency needs values >= 0 (seconds)")
        if not (math.isfinite(self.mean) and self.mean >= 0):
            raise ProfileError(f"tool_latency mean must be >= 0 seconds, got {self.mean!r}")
        if self.kind == "lognormal" and self.mean == 0:
            raise ProfileError("a lognormal tool_latency needs a positive mean")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ProfileError(f"tool_latency sigma must be >= 0, got {self.sigma!r}")

    def sample(self, rng: random.Random) -> float:
        if self.kind == "empirical":
            return rng.choice(self.values)
        if self.kind == "constant" or self.sigma == 0:
            return self.mean
        return rng.lognormvariate(math.log(self.mean) - self.sigma**2 / 2, self.sigma)

    @classmethod
    def fit(cls, values: Sequence[float]) -> DelayDist:
        """Lognormal by the moments (as lengths are); the recorded values themselves when some are zero (a
        lognormal has no zeros); constant when all agree."""
        vals = [float(v) for v in values]
        if not vals:
            raise ProfileError("no tool latencies to fit")
        if len(set(vals)) == 1:
            return cls("constant", vals[0])
        mean = sum(vals) / len(vals)
        if min(vals) <= 0:
            return cls("empirical", mean, values=tuple(vals))
        var = sum((v - mean) ** 2 for v in vals) / len(vals)
        return cls("lognormal", mean, math.sqrt(math.log1p(var / mean**2)))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "mean": self.mean}
        if self.kind == "lognormal":
            d["sigma"] = self.sigma
        if self.kind == "empirical":
            d["values"] = list(self.values)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "tool_latency") -> DelayDist:
        if not isinstance(d, Mapping):
            raise ProfileError(f"{where}: expected an object with kind and mean (seconds), got {d!r}")
        unknown = set(d) - {"kind", "mean", "sigma", "values"}
        if unknown:
            raise ProfileError(f"{where}: unknown keys {sorted(unknown)}")
        try:
            raw = d.get("values", [])
            if not isinstance(raw, list) or any(isinstance(v, bool) or not isinstance(v, int | float) for v in raw):
                raise ProfileError(f"{where}: values must be a list of seconds")
            values = tuple(float(v) for v in raw)
            if "mean" not in d and not values:
                raise ProfileError(f"{where}: missing mean")
            mean = d["mean"] if "mean" in d else sum(values) / len(values)
            sigma = d.get("sigma", 0.0)
            for name, v in (("mean", mean), ("sigma", sigma)):
                if isinstance(v, bool) or not isinstance(v, int | float):
                    raise ProfileError(f"{where}: {name} must be a number of seconds, got {v!r}")
            return cls(str(d["kind"]), float(mean), float(sigma), values)
        except KeyError as e:
            raise ProfileError(f"{where}: missing {e}") from None


@dataclass(frozen=True)
class Profile:
    name: str
    first_prompt: LengthDist
    observation: LengthDist
    output: LengthDist
    turns: LengthDist
    shared_prefix: int = 0
    description: str = ""
    source: str = ""
    length_scale: float = 1.0  # applied to every token length: reported with each result
    turn_scale: float = 1.0
    # Per turn index, where a trace had enough requests at it (``fit_profile``): observations of turns 2, 3, ...
    # and replies of turns 1, 2, ...; later turns use ``observation`` / ``output`` (all turns pooled)
    observation_by_turn: tuple[LengthDist, ...] = ()
    output_by_turn: tuple[LengthDist, ...] = ()
    # between a reply and the session's next request (tool calls, think time); None: sent at once. Not scaled
    # by ``length_scale`` (it is time, not tokens)
    tool_latency: DelayDist | None = None
    # sessions that start with one first prompt: an RL loop samples each task group_size times (GRPO groups), so
    # a server's prefix cache serves all but the first of a group's first prompts; 1: every session its own
    group_size: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.shared_prefix, bool) or not isinstance(self.shared_prefix, int) or self.shared_prefix < 0:
            raise ProfileError(
                f"shared_prefix must be a non-negative whole number of tokens, got {self.shared_prefix!r}"
            )
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise ProfileError(f"group_size must be a whole number of sessions >= 1, got {self.group_size!r}")
        for name in ("length_scale", "turn_scale"):
            v = getattr(self, name)
            if not (isinstance(v, float | int) and math.isfinite(v) and v > 0):
                raise ProfileError(f"{name} must be a positive number, got {v!r}")

    def observation_at(self, turn: int) -> LengthDist:
        """The observation length of 1-based ``turn`` (>= 2)."""
        i = turn - 2
        return self.observation_by_turn[i] if 0 <= i < len(self.observation_by_turn) else self.observation

    def output_at(self, turn: int) -> LengthDist:
        """The reply length of 1-based ``turn``."""
        i = turn - 1
        return self.output_by_turn[i] if 0 <= i < len(self.output_by_turn) else self.output

    def with_tool_latency(self, seconds: float | None) -> Profile:
        """The profile with a stated constant tool latency (``--tool-latency``, the gRPC ``tool_latency_s``): it
        replaces the profile's and is recorded in it; ``0`` takes it away; ``None`` keeps the profile's."""
        if seconds is None:
            return self
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (0 <= seconds < math.inf):
            raise ProfileError(f"tool_latency must be a number of seconds >= 0, got {seconds!r}")
        return replace(self, tool_latency=DelayDist("constant", float(seconds)) if seconds > 0 else None)

    def scaled(self, length: float = 1.0, turns: float = 1.0) -> Profile:
        """The profile shrunk for a small server by explicit factors (kept on the profile, reported)."""
        if length <= 0 or turns <= 0:
            raise ProfileError("scale factors must be positive")
        return replace(
            self,
            first_prompt=self.first_prompt.scaled(length),
            observation=self.observation.scaled(length),
            output=self.output.scaled(length),
            turns=self.turns.scaled(turns),
            observation_by_turn=tuple(d.scaled(length) for d in self.observation_by_turn),
            output_by_turn=tuple(d.scaled(length) for d in self.output_by_turn),
            shared_prefix=round(self.shared_prefix * length),
            length_scale=self.length_scale * length,
            turn_scale=self.turn_scale * turns,
        )

    def expected_isl(self) -> float:
        """Mean input length over requests (long sessions weigh more: they send more requests)."""
        t1, t2 = self.turns.mean, self.turns.second_moment()
        growth = self.output.mean + self.observation.mean
        # Σ_k ISL_k over a T-turn session = T·(prefix+first) + growth·T(T-1)/2; divide by E[T]
        return self.shared_prefix + self.first_prompt.mean + growth * (t2 - t1) / (2 * t1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "first_prompt": self.first_prompt.to_dict(),
            "observation": self.observation.to_dict(),
            "output": self.output.to_dict(),
            "turns": self.turns.to_dict(),
            "shared_prefix": self.shared_prefix,
            "length_scale": self.length_scale,
            "turn_scale": self.turn_scale,
            "observation_by_turn": [d.to_dict() for d in self.observation_by_turn],
            "output_by_turn": [d.to_dict() for d in self.output_by_turn],
            "tool_latency": self.tool_latency.to_dict() if self.tool_latency else None,
            "group_size": self.group_size,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Profile:
        if not isinstance(d, Mapping):
            raise ProfileError(f"a profile must be a JSON object, got {type(d).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ProfileError(f"profile: unknown keys {sorted(unknown)}")
        missing = [k for k in ("name", "first_prompt", "observation", "output", "turns") if k not in d]
        if missing:
            raise ProfileError(f"profile is missing {', '.join(missing)}")
        try:
            return cls(
                name=str(d["name"]),
                first_prompt=LengthDist.from_dict(d["first_prompt"], "first_prompt"),
                observation=LengthDist.from_dict(d["observation"], "observation"),
                output=LengthDist.from_dict(d["output"], "output"),
                turns=LengthDist.from_dict(d["turns"], "turns"),
                shared_prefix=_whole(d.get("shared_prefix", 0), "shared_prefix"),
                description=str(d.get("description", "")),
                source=str(d.get("source", "")),
                length_scale=_number(d.get("length_scale", 1.0), "length_scale"),
                turn_scale=_number(d.get("turn_scale", 1.0), "turn_scale"),
                observation_by_turn=_dists(d.get("observation_by_turn", []), "observation_by_turn"),
                output_by_turn=_dists(d.get("output_by_turn", []), "output_by_turn"),
                tool_latency=None if d.get("tool_latency") is None else DelayDist.from_dict(d["tool_latency"]),
                group_size=_whole(d.get("group_size", 1), "group_size"),
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, ProfileError):
                raise
            raise ProfileError(f"profile: {e}") from None


def _whole(v: Any, where: str) -> int:
    """A JSON whole number (``3`` or ``3.0``); a fraction, a string or a boolean is refused, not rounded."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v):
        raise ProfileError(f"{where} must be a whole number, got {v!r}")
    return int(v)


def _number(v: Any, where: str) -> float:
    """A JSON number; a string or a boolean is refused, not converted."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ProfileError(f"{where} must be a number, got {v!r}")
    return float(v)


def _dists(docs: Any, where: str) -> tuple[LengthDist, ...]:
    if not isinstance(docs, list):
        raise ProfileError(f"{where}: expected a list of lengths, got {type(docs).__name__}")
    return tuple(LengthDist.from_dict(x, f"{where}[{i}]") for i, x in enumerate(docs))


def _paper(name: str, isl: float, osl: float, turns: float, description: str) -> Profile:
    """A built-in profile whose request-weighted mean ISL, mean OSL and mean turns are the paper's.

    Unpublished: the split of the first prompt from the per-turn observation. Assumed: the first prompt is
    one turn's growth (output + observation), which gives growth = 2·ISL·E[T] / (E[T²] + E[T]).
    """
    turn_sigma = ASSUMED_TURN_SIGMA if turns > 1 else 0.0
    t = LengthDist("lognormal" if turn_sigma else "constant", turns, turn_sigma)
    if turns <= 1:
        first = isl
        obs = 1.0  # never used: single-turn sessions have no observation
    else:
        growth = 2 * isl * t.mean / (t.second_moment() + t.mean)
        first, obs = growth, max(1.0, growth - osl)
    src = (
        f"AgentPerfBench (arXiv 2609.34683) means ISL {isl:g} / OSL {osl:g} / {turns:g} turns; lognormal "
        f"sigma {ASSUMED_SIGMA} (lengths) and {turn_sigma} (turns) assumed; first prompt = one turn's growth assumed"
    )
    return Profile(
        name=name,
        first_prompt=LengthDist("lognormal", first, ASSUMED_SIGMA),
        observation=LengthDist("lognormal", obs, ASSUMED_SIGMA),
        output=LengthDist("lognormal", osl, ASSUMED_SIGMA),
        turns=t,
        description=description,
        source=src,
    )


PAPER_PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _paper("chat", 187, 299, 1, "single-turn chat"),
        _paper("chatbot", 1291, 169, 10, "multi-turn chatbot conversation"),
        _paper("coding", 9995, 32, 85, "coding agent (SWE-Bench-like), input:output about 355:1"),
        _paper("terminal", 7811, 31, 61, "terminal agent (TerminalBench-like)"),
        _paper("computer-use", 1399, 85, 8, "computer-use agent (OSWorld-like)"),
    )
}


def paper_profile(name: str) -> Profile:
    try:
        return PAPER_PROFILES[name]
    except KeyError:
        raise ProfileError(f"unknown profile {name!r}; built in: {', '.join(PAPER_PROFILES)}") from None


# --- traces ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceTurn:
    """One recorded request: what it appended to the conversation and how long its reply was.

    ``new_tokens`` counts the appended messages' tokens (or the prompt growth the recorder saw);
    ``messages`` is kept for exact replay when the trace has the text (empty when only counts are known).
    """

    new_tokens: int
    output_tokens: int
    messages: tuple[Mapping[str, Any], ...] = ()
    # seconds from the previous request's step to this one's, where the trace has timestamps (None: unknown, or
    # the first turn); it holds the agent's tool and think time and this request's own generation time
    delay_s: float | None = None


@dataclass(frozen=True)
class TraceSession:
    session_id: str
    turns: tuple[TraceTurn, ...]
    shared_prefix: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)


# a turn index gets its own lengths when the trace has at least this many requests at it (a mean and a
# dispersion from fewer are mostly the sample's noise); later turns use the lengths pooled over every turn
MIN_PER_TURN_FIT = 8


def _per_turn(by_turn: list[list[int]], fit: Callable[[Sequence[int]], LengthDist]) -> tuple[LengthDist, ...]:
    out: list[LengthDist] = []
    for vals in by_turn:
        if len(vals) < MIN_PER_TURN_FIT:
            break
        out.append(fit(vals))
    return tuple(out)


def fit_replies(values: Sequence[int]) -> LengthDist:
    """Reply lengths: ``LengthDist.fit``, unless they were cut at a limit.

    Where the largest recorded length recurs, requests stopped there: the recorder's ``max_tokens`` (an agent
    harness caps every call). Such lengths are censored: a lognormal fitted to them puts mass beyond the cap
    that no recorded request could have had (the loop's ATIF trace, capped at 48 with 9 of 12 first replies at
    the cap, drew first replies up to 116) and too little at the cap itself. The recorded lengths are kept
    instead (``empirical``): every draw is a length the recorder's requests could produce, the mass at the cap
    and the mean are the trace's."""
    vals = [int(v) for v in values if v > 0]
    if len(set(vals)) > 1 and vals.count(max(vals)) >= 2:
        return LengthDist("empirical", sum(vals) / len(vals), values=tuple(sorted(vals)))
    return LengthDist.fit(vals)


def _group_size(sessions: Sequence[TraceSession]) -> int:
    """Sessions per distinct first request (its messages), on average: the trace's groups of sessions that start
    alike (an RL loop's group of rollouts of one task). 1 where every session starts its own way, or where the
    trace has token counts only (no messages to compare)."""
    if any(not s.turns[0].messages for s in sessions):
        return 1
    firsts = {repr([(m.get("role"), m.get("content")) for m in s.turns[0].messages]) for s in sessions}
    return max(1, round(len(sessions) / len(firsts)))


def fit_profile(name: str, sessions: Iterable[TraceSession], source: str) -> Profile:
    """Fit lengths (first prompt, observation, output; pooled, and per turn index where the trace has enough
    requests at it) and the turn count to recorded sessions."""
    firsts: list[int] = []
    obs: list[int] = []
    outs: list[int] = []
    turns: list[int] = []
    prefixes: list[int] = []
    delays: list[float] = []
    obs_by: list[list[int]] = []  # index 0: turn 2
    outs_by: list[list[int]] = []  # index 0: turn 1
    sessions = list(sessions)
    for s in sessions:
        if not s.turns:
            raise ProfileError(f"trace session {s.session_id!r} has no turns")
        turns.append(len(s.turns))
        prefixes.append(s.shared_prefix)
        for i, t in enumerate(s.turns):
            if t.new_tokens <= 0 or t.output_tokens <= 0:
                raise ProfileError(f"trace session {s.session_id!r} turn {i + 1}: token counts must be positive")
            (firsts if i == 0 else obs).append(t.new_tokens)
            if i > 0 and t.delay_s is not None:
                delays.append(t.delay_s)
            outs.append(t.output_tokens)
            if i > 0:
                while len(obs_by) < i:
                    obs_by.append([])
                obs_by[i - 1].append(t.new_tokens)
            while len(outs_by) <= i:
                outs_by.append([])
            outs_by[i].append(t.output_tokens)
    if not turns:
        raise ProfileError("the trace has no sessions")
    return Profile(
        group_size=_group_size(sessions),
        name=name,
        first_prompt=LengthDist.fit(firsts),
        observation=LengthDist.fit(obs) if obs else LengthDist("constant", 1.0),
        output=fit_replies(outs),
        turns=LengthDist.fit(turns),
        shared_prefix=min(prefixes),
        description=f"fitted to {len(turns)} sessions, {len(outs)} requests",
        source=source,
        observation_by_turn=_per_turn(obs_by, LengthDist.fit),
        output_by_turn=_per_turn(outs_by, fit_replies),
        tool_latency=DelayDist.fit(delays) if delays else None,
    )
