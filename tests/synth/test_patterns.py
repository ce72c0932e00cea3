"""Every pattern at every knob level: reference 1.0, no-op below threshold, hanging solution 0, higher level
measurably changes the workspace; same seed, same task byte for byte.

To stay cheap, one task per level holds every pattern as a challenge (each at that level of each knob): the
per-item scores in diagnostics.json still tell every pattern apart.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
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
    run_solution,
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
            seen.append(p.measure(m.files, m.facts, bp.folder(c)))
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


def _one(pid: str, knobs: dict[str, int], layout: str = "cid") -> Blueprint:
    c = Challenge(cid="c0", pattern_id=pid, knobs=knobs)
    bp = Blueprint(
        task_id="one", version=1, skill_id="s", skill_name="s", goal="g", seed=5, capabilities={}, challenges=[c]
    )
    return fill_contract(msgspec.structs.replace(bp, layout=layout))  # type: ignore[arg-type]


def test_challenge_folders_do_not_name_their_pattern() -> None:
    # Issue 28: `c0-coupled-constraints/` told a solver what trap the folder holds. Guessing the pattern from the
    # folder names is the shortcut; it finds nothing now, and found every pattern in the old layout.
    def guessed(bp: Blueprint) -> set[str]:
        folders = {rel.split("/")[0] for rel in build_task(bp).workspace}
        return {pid for pid in pattern_ids() for f in folders if pid in f}

    bp = _blueprint(0)
    assert bp.layout == "cid" and guessed(bp) == set()
    assert {rel.split("/")[0] for rel in build_task(bp).workspace} == {c.cid for c in bp.challenges}
    assert guessed(msgspec.structs.replace(bp, layout="cid-pattern")) == set(pattern_ids())


def test_broken_configuration_notes_do_not_name_the_faulty_keys(tmp_path: Path) -> None:
    p = get_pattern("broken-configuration")
    for faults in p.knobs["faults"]:
        ((_, m),) = materials(_one(p.id, {"faults": faults}))
        spec = {ln.split(":")[0] for ln in m.files["c0/SPEC.txt"].decode().splitlines()}
        notes = {ln.split()[1] for ln in m.files["c0/NOTES.txt"].decode().splitlines()}
        assert notes == spec, (faults, notes)  # every key documented: the faulty ones are not singled out
        defaults = dict(ln.split()[1::2] for ln in m.files["c0/NOTES.txt"].decode().splitlines())
        from_notes = "OK " + ",".join(f"{k}={defaults[k]}" for k in sorted(defaults))
        assert from_notes != m.facts["output"]  # the config's valid settings are not the defaults
    # The shortcut: take NOTES as the fix (what it was when it listed only the faulty keys' values). Graded for real.
    task = write_task(build_task(_one(p.id, {"faults": 2})), tmp_path / "task")
    shortcut = "sed -E 's/^default (\\S+) is (\\S+)$/\\1 = \\2/' c0/NOTES.txt > c0/service.conf\n"
    out = run_solution(task, shortcut)
    assert (out.score, out.failure_class) == (0.0, None), out
    assert run_solution(task, 'bash "$SOLUTION_DIR/solve.sh"\n').score == 1.0


def test_sparse_signal_is_not_beaten_by_one_grep(tmp_path: Path) -> None:
    p = get_pattern("sparse-signal")
    for distractors in p.knobs["distractors"]:
        ((_, m),) = materials(_one(p.id, {"distractors": distractors}))
        order = m.instruction.split()[1]
        log = m.files["c0/payments.log"].decode().splitlines()
        assert not [ln for ln in log if f"order={order} event=refund completed" in ln]  # the old exact grep
        hits = [ln for ln in log if f"order={order}" in ln and "refund.completed" in ln]
        amounts = [int(ln.split("amount=")[1].split()[0]) for ln in hits]
        assert len(hits) >= 3 and m.facts["amount"] not in (amounts[0], amounts[-1]), (distractors, amounts)
    bp = _one(p.id, {"distractors": p.knobs["distractors"][2]})
    order = materials(bp)[0][1].instruction.split()[1]
    task = write_task(build_task(bp), tmp_path / "task")
    for pick in ("head -1", "tail -1"):  # the grep the instruction suggests, first or last match
        shortcut = (
            f"mkdir -p answers; a=$(grep 'order={order}' c0/payments.log | grep refund.completed | {pick} "
            "| grep -oE 'amount=[0-9]+' | cut -d= -f2)\n"
            '[ -n "$a" ] || exit 9\necho "{\\"amount\\": $a}" > answers/c0.json\n'
        )
        out = run_solution(task, shortcut)
        assert (out.score, out.failure_class, out.solve_exit) == (0.0, None, 0), (pick, out)
    assert run_solution(task, 'bash "$SOLUTION_DIR/solve.sh"\n').score == 1.0


def test_a_blueprint_written_before_layout_existed_still_rebuilds_to_its_bytes(tmp_path: Path) -> None:
    import json

    from opengyre.synth import load_blueprint

    old = _one("sparse-signal", {"distractors": 4}, layout="cid-pattern")
    raw = json.loads(msgspec.json.encode(old))
    del raw["layout"]  # what a blueprint.json written before held
    bp = load_blueprint(json.dumps(raw).encode())
    assert bp.layout == "cid-pattern" and build_task(bp).files == build_task(old).files
    assert load_blueprint(msgspec.json.encode(_one("sparse-signal", {"distractors": 4}))).layout == "cid"


def test_git_value_origin_is_not_beaten_by_the_log_searches_that_name_the_setting(tmp_path: Path) -> None:
    # A git repository built from bytes: the reference finds the commit; at levels >= 1 the two cheap searches a
    # solver reaches for do not — the newest commit whose message names the setting (a decoy's), and the oldest
    # commit whose diff adds its current line (``log -S``: it left that value and came back).
    p = get_pattern("git-value-origin")
    bp = _one(p.id, {"commits": 16, "decoys": 3, "returns": 1})
    instruction = materials(bp)[0][1].instruction
    key = instruction.split("`")[3]
    task = write_task(build_task(bp), tmp_path / "task")
    final = next(
        ln for ln in (task / "environment" / "workspace" / "c0" / "repo" / "settings.ini").read_text().splitlines()
        if ln.startswith(f"{key} = ")
    )  # fmt: skip
    git = "git -c safe.directory=* -C c0/repo log --format=%H"
    for search in (f"{git} --grep={key} -1", f"{git} --reverse -S'{final}' | head -1"):
        shortcut = f'mkdir -p answers; h=$({search}); [ -n "$h" ] || exit 9\necho "{{\\"commit\\": \\"$h\\"}}" > answers/c0.json\n'
        out = run_solution(task, shortcut)
        assert (out.score, out.failure_class, out.solve_exit) == (0.0, None, 0), (search, out)
    assert run_solution(task, 'bash "$SOLUTION_DIR/solve.sh"\n').score == 1.0
