"""Tasks grounded in their skill: the patterns drawn are those that declare the skill's domain, and the skill
travels with the task (``environment/skills/<name>/``, Harbor's ``skills_dir``), checked against the digests its
blueprint names, so a task dir whose skill was swapped fails the consistency gate."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import msgspec
import pytest

from opengyre.synth import (
    GateLimits,
    Synthesizer,
    build_task,
    draft_blueprint,
    draw_patterns,
    get_pattern,
    ingest,
    pattern_ids,
    read_skill_files,
    skill_digests,
    validate_task,
)

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


def test_every_shipped_skills_domain_has_patterns_that_declare_it(tmp_path: Path) -> None:
    skills = ingest(EXAMPLES, tmp_path / "sk").accepted
    assert len(skills) == 8
    for s in skills:
        fitting = [pid for pid in pattern_ids() if s.domain in get_pattern(pid).domains]
        assert len(fitting) >= 2, (s.name, s.domain, fitting)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_drawn_patterns_are_the_skills_domains_while_it_has_enough(tmp_path: Path, n: int) -> None:
    for s in ingest(EXAMPLES, tmp_path / "sk").accepted:
        fitting = {pid for pid in pattern_ids() if s.domain in get_pattern(pid).domains}
        drawn: set[str] = set()
        for seed in range(40):
            chosen = draw_patterns(random.Random(f"{s.skill_id}/{seed}"), s.capabilities, s.domain, n)
            assert len(set(chosen)) == n
            if len(fitting) >= n:
                assert set(chosen) <= fitting, (s.name, chosen)
            else:  # the domain's patterns first, then domain-free ones
                assert fitting <= set(chosen), (s.name, chosen)
            drawn |= set(chosen)
        assert len(drawn) >= min(len(fitting), 2), (s.name, drawn)  # not one pattern every time


def test_a_skill_of_a_domain_no_pattern_declares_draws_domain_free_patterns_first() -> None:
    free = {pid for pid in pattern_ids() if not get_pattern(pid).domains}
    assert len(free) >= 2
    for seed in range(20):
        chosen = draw_patterns(random.Random(seed), {}, "kubernetes", 2)
        assert set(chosen) <= free, chosen
    with pytest.raises(ValueError, match="challenges asked for"):
        draw_patterns(random.Random(0), {}, "", len(pattern_ids()) + 1)


def test_a_synthesized_task_ships_its_skill_and_says_where(tmp_path: Path) -> None:
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "sk").accepted if s.name == "csv-report")
    assert len(skill.files) > 1  # SKILL.md and its scripts
    build = Synthesizer(tmp_path / "store", GateLimits(hang_timeout_s=1.0)).synthesize(skill, 1)
    assert build.ok, [v for v in build.verdicts if not v.ok]
    bp, task = build.blueprint, build.task_dir
    assert bp.domain == skill.domain and bp.skill_files == skill_digests(read_skill_files(skill))
    assert all(skill.domain in get_pattern(c.pattern_id).domains for c in bp.challenges)
    shipped = task / "environment" / "skills" / skill.name
    assert {p.relative_to(shipped).as_posix() for p in shipped.rglob("*") if p.is_file()} == set(skill.files)
    for rel in skill.files:
        assert (shipped / rel).read_bytes() == (skill.path / rel).read_bytes()
    conf = tomllib.loads((task / "task.toml").read_text())
    assert conf["environment"]["skills_dir"] == "/skills"
    assert "COPY skills/ /skills/" in (task / "environment" / "Dockerfile").read_text()
    assert f"/skills/{skill.name}/" in (task / "instruction.md").read_text()
    assert not any(p.startswith("skills") for p in build_task(bp, read_skill_files(skill)).workspace)


def test_a_task_whose_shipped_skill_was_changed_fails_the_consistency_gate(tmp_path: Path) -> None:
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "sk").accepted if s.name == "log-triage")
    build = Synthesizer(tmp_path / "store", GateLimits(hang_timeout_s=1.0)).synthesize(skill, 2)
    assert build.ok
    (build.task_dir / "environment" / "skills" / skill.name / "SKILL.md").write_text("---\nname: x\n---\nlies\n")
    verdict = validate_task(build.task_dir)[0]
    assert verdict.gate == "consistency" and not verdict.ok and "SKILL.md" in verdict.reason, verdict


def test_a_blueprint_naming_skill_files_builds_only_with_those_files(tmp_path: Path) -> None:
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "sk").accepted if s.name == "log-triage")
    bp = draft_blueprint(
        skill_id=skill.skill_id, skill_name=skill.name,
        capabilities=skill.capabilities, seed=5, domain=skill.domain,
    )  # fmt: skip
    files = read_skill_files(skill)
    grounded = msgspec.structs.replace(bp, skill_files=skill_digests(files))
    assert f"environment/skills/{skill.name}/SKILL.md" in build_task(grounded, files).files
    with pytest.raises(ValueError, match="build it with the skill's files"):
        build_task(grounded)
    with pytest.raises(ValueError, match=r"SKILL\.md"):
        build_task(grounded, {"SKILL.md": b"another skill"})
    with pytest.raises(ValueError, match="names no skill files"):
        build_task(bp, files)
    for bad in ({"../../x": "0" * 64}, {"/etc/passwd": "0" * 64}):
        with pytest.raises(ValueError, match="not a relative path"):
            msgspec.structs.replace(bp, skill_files=bad).validate()
    with pytest.raises(ValueError, match="not a skill's name"):
        msgspec.structs.replace(grounded, skill_name="../up").validate()


def test_the_goal_line_is_written_from_the_drawn_patterns_without_their_tricks(tmp_path: Path) -> None:
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "sk").accepted if s.name == "git-history")
    goals = set()
    for seed in range(8):
        bp = draft_blueprint(
            skill_id=skill.skill_id, skill_name=skill.name, capabilities=skill.capabilities, seed=seed,
            n_challenges=2, domain=skill.domain,
        )  # fmt: skip
        said = bp.goal.lower()
        assert all(get_pattern(c.pattern_id).goal in said for c in bp.challenges), bp.goal
        assert skill.name in bp.goal and not any(c.pattern_id in bp.goal for c in bp.challenges), bp.goal
        assert f"# {bp.goal}\n" in build_task(bp).files["instruction.md"].decode()
        goals.add(bp.goal)
    assert len(goals) > 2, goals  # not one template
    # Each pattern's phrasing says what to do, not how it is made hard (its summary may: decoys, distractors).
    tricks = ("decoy", "distractor", "greedy", "look-alike", "reversed", "trap", "precedence", "topological")
    for pid in pattern_ids():
        p = get_pattern(pid)
        assert p.goal != p.summary and not any(t in p.goal for t in tricks), (pid, p.goal)
