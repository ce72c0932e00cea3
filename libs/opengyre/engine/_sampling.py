"""SGLang's ``sampling_params``: validation (unknown keys are a 400, as in SGLang 0.5.23) and the sampler."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import regex
import torch

from ._schema_regex import schema_regex

__all__ = ["SUPPORTED_KEYS", "SamplingError", "SamplingParams", "sample_next"]


class SamplingError(ValueError):
    """A bad ``sampling_params`` object; the HTTP layer answers 400 with the message."""


# Every key SGLang's SamplingParams knows. The structured-output ones are refused explicitly (a CPU engine
# without a grammar backend must not silently ignore a constraint), the rest are honoured.
SUPPORTED_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "stop",
        "stop_token_ids",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "n",
        "logit_bias",
        "sampling_seed",
        "custom_params",
        "stream_interval",
        "json_schema",
        "regex",
    }
)
# Structured output the CPU engine has no grammar for: refused explicitly, never silently ignored.
_UNSUPPORTED_KEYS = frozenset({"ebnf", "structural_tag", "stop_regex"})


def _num(d: dict[str, Any], key: str, default: float, *, lo: float | None = None, hi: float | None = None) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SamplingError(f"sampling_params.{key} must be a number, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise SamplingError(f"sampling_params.{key}={v} is out of range [{lo}, {hi}]")
    return float(v)


def _int(d: dict[str, Any], key: str, default: int | None, *, lo: int | None = None) -> int | None:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise SamplingError(f"sampling_params.{key} must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise SamplingError(f"sampling_params.{key}={v} must be >= {lo}")
    return v


# What torch.Generator.manual_seed takes (a seed outside would fail the request once scheduled).
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)


def _seed(d: dict[str, Any]) -> int | None:
    seed = _int(d, "sampling_seed", None)
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise SamplingError(f"sampling_params.sampling_seed={seed} must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
    return seed


def _bool(d: dict[str, Any], key: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise SamplingError(f"sampling_params.{key} must be a boolean, got {v!r}")
    return v


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    constraint: str | None = None  # a regular expression the output text must match (regex / json_schema)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1

    @property
    def penalised(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    @classmethod
    def parse(cls, raw: object, vocab_size: int) -> SamplingParams:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise SamplingError("sampling_params must be an object")
        unknown = sorted(set(raw) - SUPPORTED_KEYS - _UNSUPPORTED_KEYS)
        if unknown:
            raise SamplingError(f"Unknown sampling parameter(s): {', '.join(unknown)}")
        for key in sorted(_UNSUPPORTED_KEYS & set(raw)):
            if raw[key] is not None:
                raise SamplingError(f"sampling_params.{key} is not supported by the OpenGyre CPU engine")
        n = _int(raw, "n", 1, lo=1)
        if n != 1:
            raise SamplingError("sampling_params.n > 1 is not supported by the OpenGyre CPU engine")
        stop_raw = raw.get("stop")
        if stop_raw is None:
            stop: tuple[str, ...] = ()
        elif isinstance(stop_raw, str):
            stop = (stop_raw,) if stop_raw else ()
        elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
            stop = tuple(s for s in stop_raw if s)
        else:
            raise SamplingError("sampling_params.stop must be a string or a list of strings")
        stop_ids_raw = raw.get("stop_token_ids") or []
        if not isinstance(stop_ids_raw, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in stop_ids_raw
        ):
            raise SamplingError(f"sampling_params.stop_token_ids must be token ids in [0, {vocab_size})")
        bias_raw = raw.get("logit_bias") or {}
        if not isinstance(bias_raw, dict):
            raise SamplingError("sampling_params.logit_bias must be an object of token id -> bias")
        bias: dict[int, float] = {}
        for k, v in bias_raw.items():
            try:
                tid = int(k)
            except (TypeError, ValueError):
                raise SamplingError(f"sampling_params.logit_bias key {k!r} is not a token id") from None
            if not 0 <= tid < vocab_size or isinstance(v, bool) or not isinstance(v, int | float):
                raise SamplingError(f"sampling_params.logit_bias[{k!r}] is invalid")
            bias[tid] = float(v)
        max_new = _int(raw, "max_new_tokens", 128, lo=0)
        assert max_new is not None
        top_k = _int(raw, "top_k", -1)
        assert top_k is not None
        if top_k == 0 or top_k < -1:
            raise SamplingError("sampling_params.top_k must be -1 (off) or >= 1")
        return cls(
            constraint=_constraint(raw),
            max_new_tokens=max_new,
            min_new_tokens=_int(raw, "min_new_tokens", 0, lo=0) or 0,
            stop=stop,
            stop_token_ids=frozenset(stop_ids_raw),
            temperature=_num(raw, "temperature", 1.0, lo=0.0),
            top_p=_num(raw, "top_p", 1.0, lo=1e-9, hi=1.0),
            top_k=top_k,
            min_p=_num(raw, "min_p", 0.0, lo=0.0, hi=1.0),
            frequency_penalty=_num(raw, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),
            presence_penalty=_num(raw, "presence_penalty", 0.0, lo=-2.0, hi=2.0),
            repetition_penalty=_num(raw, "repetition_penalty", 1.0, lo=1e-9, hi=2.0),
            ignore_eos=_bool(raw, "ignore_eos", False),
            skip_special_tokens=_bool(raw, "skip_special_tokens", True),
            spaces_between_special_tokens=_bool(raw, "spaces_between_special_tokens", True),
            no_stop_trim=_bool(raw, "no_stop_trim", False),
            logit_bias=bias,
            seed=_seed(raw),
        )


def _constraint(raw: dict[str, Any]) -> str | None:
    """SGLang's ``regex`` or ``json_schema`` (a JSON string) as one regular expression; at most one of them."""
    given = [k for k in ("regex", "json_schema") if raw.get(k) is not None]
    if len(given) > 1:
        raise SamplingError("Only one of regex, json_schema, or ebnf can be set.")
    if not given:
        return None
    value = raw[given[0]]
    if not isinstance(value, str):
        raise SamplingError(f"sampling_params.{given[0]} must be a string")
    if given[0] == "regex":
        pattern = value
    else:
        try:
            pattern = schema_regex(json.loads(value))
        except ValueError as exc:  # SchemaUnsupported is one, and so is malformed JSON
            raise SamplingError(f"sampling_params.json_schema: {exc}") from None
    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise SamplingError(f"sampling_params.regex does not compile: {exc}") from None
    return pattern


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    counts: torch.Tensor | None,
    ban: frozenset[int],
    allow: torch.Tensor | None = None,
) -> tuple[int, torch.Tensor]:
    """One token from a row of logits (float32, [vocab]) and the behaviour logprobs it was drawn under.

    The logprob is taken from the distribution after logit processors and temperature but before top-k/p
    truncation (SGLang's default); at temperature 0 (greedy) it is the plain model distribution.
    """
    x = logits.float()
    if params.logit_bias:
        idx = torch.tensor(list(params.logit_bias), dtype=torch.long)
        x = x.clone()
        x[idx] += torch.tensor(list(params.logit_bias.values()), dtype=x.dtype)
    if counts is not None and params.penalised:
        seen = counts > 0
        if params.repetition_penalty != 1.0:
            x = torch.where(seen, torch.where(x > 0, x / params.repetition_penalty, x * params.repetition_penalty), x)
        x = x - params.frequency_penalty * counts - params.presence_penalty * seen.float()
    if ban:
        x = x.clone()
        x[list(ban)] = float("-inf")
    if allow is not None:  # constrained decoding: the behaviour distribution is the masked one
        x = x.masked_fill(~allow, float("-inf"))
    if params.greedy:
        return int(torch.argmax(x)), torch.log_softmax(x, dim=-1)
    scaled = x / params.temperature
    logprobs = torch.log_softmax(scaled, dim=-1)
    probs = logprobs.exp()
    if params.top_k > 0 and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=0)
        drop = cum - sorted_p > params.top_p
        sorted_p = torch.where(drop, torch.zeros_like(sorted_p), sorted_p)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
    if params.min_p > 0.0:
        probs = torch.where(probs < params.min_p * probs.max(), torch.zeros_like(probs), probs)
    return int(torch.multinomial(probs, 1, generator=generator)), logprobs
