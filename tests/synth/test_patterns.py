"""Every pattern at every knob level: reference 1.0, no-op below threshold, hanging solution 0, higher level
measurably changes the workspace; same seed, same task byte for byte.

To stay cheap, one task per level holds every pattern as a challenge (each at that level of each knob): the
per-item scores in diagnostics.json still tell every pattern apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opengyre.synth import (
    Blueprint,
    Challenge,
    GateLimits,
    build_task,
    fill_contract,
    get_pattern,
    materials,
    pattern_ids,
    validate_task,
    write_task,
)

MAX_LEVELS = max(len(levels) for p in pattern_ids() for levels in get_pattern(p).knobs.values())


def _blueprint(level: int, seed: int = 7) -> Blueprint:
    challenges = []
    for i, pid in enumerate(pattern_ids()):
        knobs = {k: v[min(level, len(v) - 1)] for k, v in get_pattern(pid).knobs.items()}
        challenges.append(Challenge(cid=f"c{i}", pattern_id=pid, knobs=knobs))
    bp = Blueprint(
        task_id=f"all-l{level}",
        version=1,
        skill_id="test",
        skill_name="test",
        goal="every pattern",
        seed=seed,
        capabilities={},
        challenges=challenges,
    )
    return fill_contract(bp)


def test_the_pool_covers_every_dimension_and_the_named_patterns() -> None:
    dims = {get_pattern(p).dimension for p in pattern_ids()}
    assert len(dims) == 5
    for named in (
        "distributed-evidence",
        "nested-discovery",
        "sparse-signal",
        "state-dependency",
        "coupled-constraints",
        "missing-dependency",
        "broken-configuration",
        "failing-step",
    ):
        assert named in pattern_ids()


@pytest.mark.parametrize("level", range(MAX_LEVELS))
def test_every_pattern_at_a_level_passes_the_gates(level: int, tmp_path: Path) -> None:
    bp = _blueprint(level)
    task = write_task(build_task(bp), tmp_path / "task")
    verdicts = {v.gate: v for v in validate_task(task, GateLimits(hang_timeout_s=1.0))}
    assert all(v.ok for v in verdicts.values()), {g: v.reason for g, v in verdicts.items() if not v.ok}
    # The no-op gate holds per challenge (each pattern below threshold alone), which is what this level checks.
    assert "on every challenge" in verdicts["noop"].reason


def test_a_higher_level_measurably_changes_the_workspace() -> None:
    for pid in pattern_ids():
        p = get_pattern(pid)
        seen = []
        for level in p.knobs[p.primary]:
            c = Challenge(cid="c0", pattern_id=pid, knobs={p.primary: level})
            bp = Blueprint(
                task_id="m", version=1, skill_id="s", skill_name="s", goal="g", seed=3, capabilities={}, challenges=[c]
            )
            ((_, m),) = materials(bp)
            seen.append(p.measure(m.files, m.facts, f"c0-{pid}"))
        assert seen == sorted(seen) and len(set(seen)) == len(seen), (pid, p.primary, seen)


def test_same_seed_same_task_byte_for_byte(tmp_path: Path) -> None:
    a = write_task(build_task(_blueprint(1, seed=11)), tmp_path / "a")
    b = write_task(build_task(_blueprint(1, seed=11)), tmp_path / "b")
    files_a = {p.relative_to(a): (p.read_bytes(), p.stat().st_mode) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b): (p.read_bytes(), p.stat().st_mode) for p in b.rglob("*") if p.is_file()}
    assert files_a == files_b
    other = build_task(_blueprint(1, seed=12)).files
    assert other != build_task(_blueprint(1, seed=11)).files


def test_the_gates_catch_a_broken_task(tmp_path: Path) -> None:
    bp = _blueprint(0)
    task = write_task(build_task(bp), tmp_path / "task")
    solve = task / "solution" / "solve.py"
    solve.write_text(solve.read_text().replace("_c0()\n", "pass\n", 1))  # the reference skips a challenge
    grader = task / "tests" / "grade.py"  # and the grader crashes on an answer that is not JSON
    text = grader.read_text()
    assert text.count("except ValueError:\n            return 0.0") == 2
    grader.write_text(
        text.replace("except ValueError:\n            return 0.0", "except ValueError:\n            raise")
    )
    verdicts = {v.gate: v for v in validate_task(task, GateLimits(hang_timeout_s=1.0))}
    assert not verdicts["reference"].ok
    assert not verdicts["consistency"].ok  # the directory is not what the blueprint builds
    assert not verdicts["crash"].ok and "valid low score on the wreck" in verdicts["crash"].reason
    assert verdicts["noop"].ok and verdicts["hang"].ok and verdicts["oom"].ok
