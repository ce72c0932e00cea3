"""A task's seed is keyed with its store's secret: the generators and skills are no secret (the namespace sandbox
hides the generators' code, but a policy may know it), so from a run's small seeds alone an agent could rebuild a
task and its reference solution (it did, in seconds)."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

from opengyre.synth import Synthesizer, build_task, draft_blueprint, ingest, read_skill_files

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


def test_the_same_store_gives_the_same_seed_another_store_another(tmp_path: Path) -> None:
    a, b = Synthesizer(tmp_path / "a"), Synthesizer(tmp_path / "b")
    seed = a.task_seed("csv-report-x", 3)
    assert Synthesizer(tmp_path / "a").task_seed("csv-report-x", 3) == seed  # the key persists with the store
    assert b.task_seed("csv-report-x", 3) != seed and a.task_seed("csv-report-x", 4) != seed
    assert seed >= 1 << 40  # not a small number a search would reach
    key = tmp_path / "a" / "seed.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(bytes.fromhex(key.read_text())) == 32


def test_concurrent_first_uses_of_a_store_agree_on_one_key(tmp_path: Path) -> None:
    seeds: list[int] = []
    threads = [
        threading.Thread(target=lambda: seeds.append(Synthesizer(tmp_path / "s").task_seed("k", 1))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seeds) == 8 and len(set(seeds)) == 1


def test_a_synthesized_task_is_not_the_one_its_public_seed_builds(tmp_path: Path) -> None:
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "sk").accepted if s.name == "csv-report")
    synth = Synthesizer(tmp_path / "store")
    bp = synth.synthesize(skill, 3).blueprint
    public = draft_blueprint(
        skill_id=skill.skill_id, skill_name=skill.name,
        capabilities=skill.capabilities, seed=3, n_challenges=2, level=0, domain=skill.domain,
    )  # fmt: skip
    assert bp.seed == synth.task_seed(skill.skill_id, 3) != 3
    ours = build_task(bp, read_skill_files(skill)).files["solution/solve.py"]
    assert ours != build_task(public).files["solution/solve.py"]
