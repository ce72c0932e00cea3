"""Running ledger (long-horizon consistency): transactions over monthly files applied in order (knob: transactions)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, answer_items, register, write_answer_py

_ACCOUNTS = ("alice", "bob", "carol", "dave")


class Config(msgspec.Struct, frozen=True):
    transactions: int


@register
class RunningLedger(Pattern):
    id = "running-ledger"
    dimension = "long-horizon-consistency"
    domains = frozenset({"csv-json-data"})
    summary = "balances carried through many transactions spread over monthly files, overdrafts refused"
    goal = "carry balances through a series of transfers"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"transactions": (5, 20, 60, 150)}
    primary = "transactions"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        bal = {a: 100 for a in _ACCOUNTS}
        months: dict[int, list[str]] = {}
        for i in range(cfg.transactions):
            src, dst = rng.sample(_ACCOUNTS, 2)
            amt = rng.randrange(1, 80)
            months.setdefault(1 + i * 12 // cfg.transactions, []).append(f"{i:05d} {src} {dst} {amt}")
            if bal[src] >= amt:  # a transfer that would overdraw is refused, so order matters
                bal[src] -= amt
                bal[dst] += amt
        files = {f"{ns}/ledger/2026-{m:02d}.txt": ("\n".join(v) + "\n").encode() for m, v in months.items()}
        files[f"{ns}/RULES.txt"] = (
            b"Every account opens with 100. Apply transfers in sequence order; a transfer that would make the source"
            b" negative is refused (skipped).\n"
        )
        sol = (
            f"b = dict.fromkeys({list(_ACCOUNTS)!r}, 100)\nrows = []\nd = {ns + '/ledger'!r}\n"
            "for fn in os.listdir(d): rows += [l.split() for l in open(os.path.join(d, fn)) if l.strip()]\n"
            "for _, s, t, a in sorted(rows):\n    a = int(a)\n"
            "    if b[s] >= a: b[s] -= a; b[t] += a\n"
        ) + write_answer_py(cid, "b")
        return Material(
            files=files,
            instruction=(
                f"Apply the transfers in `{ns}/ledger/` following `{ns}/RULES.txt` and write the final "
                f"balances (account -> integer) as JSON to `answers/{cid}.json`."
            ),
            facts=bal,
            rubric=answer_items(cid, bal),
            solution=sol,
            infer=["balances after every transfer"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(b.count(b"\n") for p, b in files.items() if p.startswith(f"{ns}/ledger/")))
