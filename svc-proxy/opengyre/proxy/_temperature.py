"""The temperature a call's recorded logprobs are at, for the trainer to compute its own at the same one.

SGLang (and the built-in CPU engine, which follows it) returns the sampled token's logprob from the distribution
after temperature, before top-k/p truncation; a greedy request (temperature < 1e-5) gets the raw logits' (SGLang
resets its temperature to 1). With ``top_k == 1`` and another temperature SGLang's answer depends on the batch
(raw logits when the whole batch is greedy, scaled otherwise): unknown. vLLM returns raw logprobs by default
(``--logprobs-mode raw_logprobs``): at temperature 1 whatever it sampled with, so only a temperature-1 call is
known. Penalties and logit biases change the distribution in ways the trainer does not reproduce: unknown too.
Unknown is None; the trainer refuses to train such a call rather than assume a temperature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_TEMPERATURE", "logprob_temperature"]

# OpenAI's and Anthropic's documented default; the gateway sends it explicitly, so an engine never falls back
# to a default of its own (SGLang can take the model's generation config).
DEFAULT_TEMPERATURE = 1.0
_GREEDY = 1e-5


def logprob_temperature(sampling: Mapping[str, Any], *, raw_logprobs: bool) -> float | None:
    t = sampling.get("temperature")
    if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
        return None
    if sampling.get("logit_bias") or any(
        sampling.get(k, neutral) != neutral
        for k, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0))
    ):
        return None
    if raw_logprobs:
        return 1.0 if t == 1.0 else None
    if t < _GREEDY:
        return 1.0
    if sampling.get("top_k") == 1 and t != 1.0:
        return None
    return float(t)
