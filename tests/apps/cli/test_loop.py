"""`opengyre train loop|env` (the apps layer's commands joined to the trainer's `train` group) as a user runs them."""

from __future__ import annotations

from pathlib import Path

from opengyre.harness import HARNESS_VERSIONS

from ._cli import og


def test_train_loop_refuses_a_bad_run_file_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text('model = "gpt-9"\n')
    r = og("train", "loop", str(run), "--data-dir", str(tmp_path / "data"))
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert "model: unknown model 'gpt-9'" in r.stderr + r.stdout
    assert not (tmp_path / "data").exists()  # no service started


def test_a_harness_that_is_not_installed_is_refused_naming_how_to_install_it(tmp_path: Path) -> None:
    """`train loop` with ``harness = "claude-code"`` and `demo --harness claude-code`, where no claude is on PATH:
    exit 2, one line that says how to install the pinned version, before anything starts."""
    empty = tmp_path / "bin"
    empty.mkdir()
    run = tmp_path / "run.toml"
    run.write_text('harness = "claude-code"\nskill_names = ["csv-report"]\n')
    for args in (["train", "loop", str(run)], ["demo", "--harness", "claude-code"]):
        r = og(*args, "--data-dir", str(tmp_path / "data"), env={"PATH": str(empty)})
        said = (r.stdout + r.stderr).strip()
        assert r.returncode == 2 and said.count("\n") == 0, said
        assert said.endswith(
            "harness claude-code is not installed: `npm install -g @anthropic-ai/claude-code@"
            f"{HARNESS_VERSIONS['claude-code']['version']}` (`make harnesses` installs every pinned harness)"
        ), said
    assert not (tmp_path / "data" / "runs").exists() and not (tmp_path / "data" / "logs").exists()
