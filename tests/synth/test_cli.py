"""`opengyre synth ...` as a user runs it."""

from __future__ import annotations

from pathlib import Path

from tests.apps.cli._cli import og

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


def test_ingest_shows_each_verdict_and_fails_without_an_accepted_skill(tmp_path: Path) -> None:
    # One CLI start (they are costly): a folder with a good and a bad skill, then an error exit with the reason.
    (tmp_path / "bad" / "csv-report").mkdir(parents=True)
    (tmp_path / "bad" / "csv-report" / "SKILL.md").write_bytes((EXAMPLES / "csv-report" / "SKILL.md").read_bytes())
    bad = tmp_path / "bad" / "bad-skill"
    bad.mkdir(parents=True)
    (bad / "SKILL.md").write_text("---\nname: other\ndescription: d\n---\nbody\n")
    res = og("synth", "ingest", str(tmp_path / "bad"), "--out", str(tmp_path / "y"))
    assert res.returncode == 0, res.stdout
    assert "does not match its folder" in res.stdout and "accepted" in res.stdout
    assert all(d in res.stdout for d in ("skill-use=", "error-recovery="))  # capability requirements shown


def test_patterns_fit_80_columns() -> None:
    from opengyre.synth import pattern_ids

    res = og("synth", "patterns", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert {ln.split()[0] for ln in lines if ln.startswith("  ") and not ln.startswith("   ")} == set(pattern_ids())


def test_build_picks_patterns_and_knobs_and_another_level_is_another_task(tmp_path: Path) -> None:
    import json

    skills = tmp_path / "skills"
    (skills / "csv-report").mkdir(parents=True)
    for p in (EXAMPLES / "csv-report").rglob("*"):
        if p.is_file():
            (skills / "csv-report" / p.relative_to(EXAMPLES / "csv-report")).parent.mkdir(parents=True, exist_ok=True)
            (skills / "csv-report" / p.relative_to(EXAMPLES / "csv-report")).write_bytes(p.read_bytes())
    store = tmp_path / "store"
    bad = og("synth", "build", str(skills), "--out", str(store), "--pattern", "no-such-pattern")
    assert bad.returncode == 2 and "unknown pattern 'no-such-pattern'" in bad.stdout, bad.stdout
    bad = og("synth", "build", str(skills), "--out", str(store), "--pattern", "log-count", "--knob", "rows=3")
    assert bad.returncode == 2 and "knob 'rows'" in bad.stdout and "Traceback" not in bad.stderr, bad.stdout
    args = ("synth", "build", str(skills), "--out", str(store), "--pattern", "csv-aggregate", "--knob")
    for level in (0, 1):
        res = og(*args, "csv-aggregate.rows=" + _level(1), "--level", str(level), "--workers", "1")
        assert res.returncode == 0, res.stdout + res.stderr
    built = sorted((store / "tasks").iterdir())
    assert [p.name.split("-l")[1][0] for p in built] == ["0", "1"]  # the level is in the id: no FileExistsError
    bp = json.loads((built[0] / "v1" / "tests" / "blueprint.json").read_text())
    assert [(c["pattern_id"], c["knobs"]["rows"]) for c in bp["challenges"]] == [("csv-aggregate", int(_level(1)))]
    # The lineage without a stack or catalogue: from the store's blueprints.
    res = og("synth", "lineage", built[0].name, "--store", str(store))
    assert res.returncode == 0 and "csv-aggregate" in res.stdout, res.stdout + res.stderr
    res = og("synth", "lineage", "nope", "--data-dir", str(tmp_path / "nostack"))
    assert res.returncode == 2 and "no task nope" in res.stdout and "Traceback" not in res.stderr, res.stderr


def _level(i: int) -> str:
    from opengyre.synth import get_pattern

    return str(get_pattern("csv-aggregate").knobs["rows"][i])


def test_an_error_naming_task_toml_keys_is_printed_whole(tmp_path: Path) -> None:
    d = tmp_path / "t"
    (d / "tests").mkdir(parents=True)
    (d / "environment").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (d / "instruction.md").write_text("x\n")
    (d / "task.toml").write_text('[task]\nname = "no-slash"\n')
    res = og("synth", "import", str(d))
    assert res.returncode == 2 and "[task] name 'no-slash'" in res.stdout, res.stdout  # not eaten as markup
