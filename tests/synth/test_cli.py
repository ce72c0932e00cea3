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
