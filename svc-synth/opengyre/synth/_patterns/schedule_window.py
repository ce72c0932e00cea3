"""Schedule window (planning): the earliest hour every calendar leaves free (knob: calendars)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    calendars: int


@register
class ScheduleWindow(Pattern):
    id = "schedule-window"
    dimension = "planning"
    summary = "the earliest 60-minute slot free in every calendar (half-hour grid, 09:00-17:00)"
    goal = "find a meeting slot free for everyone"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"calendars": (2, 3, 5, 8)}
    primary = "calendars"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        slots = list(range(18, 34))  # half-hours from 09:00 to 17:00
        answer = rng.choice(slots[4:-2])
        files = {}
        busy_all: set[int] = set()
        for i in range(cfg.calendars):
            busy = {s for s in slots if s not in (answer, answer + 1) and rng.random() < 0.35}
            if i == 0:
                busy |= {s for s in slots if s < answer and s not in busy_all and s % 3 == 0}
            busy -= {answer, answer + 1}
            busy_all |= busy
            text = "".join(f"busy {s // 2:02d}:{30 * (s % 2):02d}\n" for s in sorted(busy))
            files[f"{ns}/calendars/{name(rng, 1)}-{i}.txt"] = text.encode()
        free = [s for s in slots[:-1] if s not in busy_all and s + 1 not in busy_all]
        first = free[0]
        hhmm = f"{first // 2:02d}:{30 * (first % 2):02d}"
        sol = (
            f"d = {ns + '/calendars'!r}\nbusy = set()\n"
            "for fn in os.listdir(d):\n    for l in open(os.path.join(d, fn)):\n"
            "        h, m = l.split()[1].split(':'); busy.add(int(h) * 2 + int(m) // 30)\n"
            "s = next(s for s in range(18, 33) if s not in busy and s + 1 not in busy)\n"
        ) + write_answer_py(cid, "{'start': f'{s // 2:02d}:{30 * (s % 2):02d}'}")
        return Material(
            files=files,
            instruction=(
                f"Each file in `{ns}/calendars/` lists busy half-hours (`busy HH:MM`). Find the earliest "
                "start of a 60-minute meeting between 09:00 and 17:00 free for everyone; write "
                f'`{{"start": "HH:MM"}}` to `answers/{cid}.json`.'
            ),
            facts={"start": hhmm},
            rubric=answer_items(cid, {"start": hhmm}),
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/calendars/")))
