"""Sparse-signal retrieval: one relevant line among topic-near distractors (knob: distractors per signal)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    distractors: int


_NEAR = ("refund requested", "refund reversed", "refund pending", "refund denied")


@register
class SparseSignal(Pattern):
    id = "sparse-signal"
    dimension = "environment-understanding"
    summary = "the one relevant fact buried among near-topic distractor lines"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"distractors": (4, 20, 80, 240)}
    primary = "distractors"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        order = rng.randrange(1000, 9999)
        amount = rng.randrange(100, 99999)
        lines = [f"order={order} event=refund completed amount={amount}"]
        for _ in range(cfg.distractors):
            if rng.random() < 0.5:  # same order, another refund state
                lines.append(f"order={order} event={rng.choice(_NEAR)} amount={rng.randrange(100, 99999)}")
            else:  # same state, another order
                lines.append(
                    f"order={order + rng.randrange(1, 50)} event=refund completed amount={rng.randrange(100, 99999)}"
                )
        rng.shuffle(lines)
        log = "".join(f"2026-11-{1 + i % 28:02d}T10:{i % 60:02d}:00Z {line}\n" for i, line in enumerate(lines))
        files = {f"{ns}/payments.log": log.encode()}
        sol = (
            f"for line in open({ns + '/payments.log'!r}):\n"
            f"    if ' order={order} event=refund completed ' in line: amt = int(line.rsplit('=', 1)[1])\n"
        ) + write_answer_py(cid, "{'amount': amt}")
        return Material(
            files=files,
            instruction=(
                f"Order {order} was refunded. Find the completed refund's amount in `{ns}/payments.log` and write "
                f'`{{"amount": <integer>}}` to `answers/{cid}.json`.'
            ),
            facts={"amount": amount},
            rubric=answer_items(cid, {"amount": amount}),
            solution=sol,
            given=[f"order {order}"],
            discover=["the completed refund line among near-topic distractors"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        log = files[f"{ns}/payments.log"].decode().splitlines()
        return float(sum(1 for line in log if "refund" in line) - 1)
