"""`opengyre train loop|env` (the apps layer's commands joined to the trainer's `train` group) as a user runs them."""

from __future__ import annotations

from pathlib import Path

from ._cli import og


def test_train_loop_refuses_a_bad_run_file_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    run = tmp_path / "run.toml"
    run.write_text('model = "gpt-9"\n')
    r = og("train", "loop", str(run), "--data-dir", str(tmp_path / "data"))
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert "model: unknown model 'gpt-9'" in r.stderr + r.stdout
    assert not (tmp_path / "data").exists()  # no service started
