"""Sparse-signal retrieval: one relevant line among topic-near distractors (knob: distractors per signal)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    distractors: int


_NEAR = ("refund.requested", "refund.pending", "refund.denied")


def _line(rng: random.Random, fields: dict[str, object]) -> str:
    # Fields in a varying order: no one exact string finds every line of a kind.
    keys = list(fields)
    rng.shuffle(keys)
    return " ".join(f"{k}={fields[k]}" for k in keys)


@register
class SparseSignal(Pattern):
    id = "sparse-signal"
    dimension = "environment-understanding"
    domains = frozenset({"logs"})
    summary = "the one standing refund among near-topic distractors and refunds of it reversed later"
    goal = "find the amount of a refund in a payments log"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"distractors": (4, 20, 80, 240)}
    primary = "distractors"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        order = rng.randrange(1000, 9999)
        refs = rng.sample(range(10000, 99999), cfg.distractors + 8 + cfg.distractors // 40)
        # (time, fields): the order's standing refund between reversed ones of it (two, more at higher levels),
        # so neither a grep for the order's completed refunds nor its first or last match is the answer.
        decoys = 2 + cfg.distractors // 40
        slot = rng.randrange(1, decoys)  # strictly between the first and the last completed refund of the order
        events: list[tuple[int, dict[str, object]]] = []
        amount = 0
        t = 0
        for i in range(decoys + 1):
            t += rng.randrange(1, 40)
            amt, ref = rng.randrange(100, 99999), refs.pop()
            events.append((t, {"order": order, "event": "refund.completed", "amount": amt, "ref": ref}))
            if i == slot:
                amount = amt
            else:  # reversed later, naming the refund
                events.append((t + rng.randrange(1, 2000), {"order": order, "event": "refund.reversed", "ref": ref}))
        for _ in range(cfg.distractors):
            ts, ref = rng.randrange(1, 3000), refs.pop()
            if rng.random() < 0.5:  # the same order, another refund state
                fields: dict[str, object] = {"order": order, "event": rng.choice(_NEAR), "ref": ref}
            else:  # a standing refund of another order
                fields = {"order": order + rng.randrange(1, 50), "event": "refund.completed", "ref": ref}
            events.append((ts, {**fields, "amount": rng.randrange(100, 99999)}))
        events.sort(key=lambda e: e[0])
        log = "".join(
            f"2026-11-{1 + ts // 1440 % 28:02d}T{ts // 60 % 24:02d}:{ts % 60:02d}:00Z {_line(rng, f)}\n"
            for ts, f in events
        )
        files = {f"{ns}/payments.log": log.encode()}
        sol = (
            "done, reversed = {}, set()\n"
            f"for line in open({ns + '/payments.log'!r}):\n"
            "    kv = dict(t.split('=', 1) for t in line.split()[1:])\n"
            f"    if kv.get('order') == {str(order)!r} and kv['event'] == 'refund.completed':\n"
            "        done[kv['ref']] = int(kv['amount'])\n"
            f"    elif kv.get('order') == {str(order)!r} and kv['event'] == 'refund.reversed':\n"
            "        reversed.add(kv['ref'])\n"
            "(amt,) = [a for r, a in done.items() if r not in reversed]\n"
        ) + write_answer_py(cid, "{'amount': amt}")
        return Material(
            files=files,
            instruction=(
                f"Order {order} was refunded more than once, and every refund of it but one was reversed later "
                f"(a reversal names the refund's `ref`). Find the amount of the refund that stands in "
                f'`{ns}/payments.log` and write `{{"amount": <integer>}}` to `answers/{cid}.json`.'
            ),
            facts={"amount": amount},
            rubric=answer_items(cid, {"amount": amount}),
            solution=sol,
            given=[f"order {order}", "a reversal names the refund it reverses"],
            discover=["the order's completed refunds and their reversals among near-topic distractors"],
            infer=["the one completed refund no reversal names"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        log = files[f"{ns}/payments.log"].decode().splitlines()
        return float(sum(1 for line in log if "refund" in line) - 1)
