"""The gates on a tampered task: a blueprint that does not decode, names an unknown pattern or knob, or a rubric
that does not parse, fails the gates with the reason instead of crashing the one that reads it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from opengyre.synth import GATES, build_task, draft_blueprint, ingest, validate_task, write_task

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gates")
    sk = next(s for s in ingest(EXAMPLES, tmp / "skills").accepted if s.name == "csv-report")
    bp = draft_blueprint(skill_id=sk.skill_id, skill_name=sk.name, capabilities=sk.capabilities, seed=1)
    return write_task(build_task(bp), tmp / "task")


@pytest.mark.parametrize(
    ("rel", "tamper", "why"),
    [
        ("tests/blueprint.json", lambda t: "{not json", "not a valid blueprint: JSON is malformed"),
        ("tests/blueprint.json", lambda t: t.replace('"knobs": {', '"knobs": {"bogus": 7, ', 1), "unknown knob"),
        ("tests/blueprint.json", lambda t: t.replace('"pattern_id": "', '"pattern_id": "nope-', 1), "unknown pattern"),
        ("tests/blueprint.json", lambda t: t.replace('"seed": ', '"seed": "x', 1), "not a valid blueprint"),
        ("tests/rubric.json", lambda t: "[]", "do not parse"),
    ],
)
def test_a_tampered_task_fails_the_gates_with_the_reason(
    task: Path, tmp_path: Path, rel: str, tamper: Callable[[str], str], why: str
) -> None:
    d = tmp_path / "t"
    shutil.copytree(task, d)
    (d / rel).write_text(tamper((d / rel).read_text()))
    verdicts = validate_task(d)
    assert [v.gate for v in verdicts] == list(GATES)
    assert not verdicts[0].ok and why in verdicts[0].reason, verdicts[0]
