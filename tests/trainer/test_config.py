"""The trainer's configuration: validated before anything runs, read from a trainer.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from opengyre.trainer import TrainerConfig


def test_from_toml_resolves_paths_and_means_all_paths_by_zero(tmp_path: Path) -> None:
    f = tmp_path / "trainer.toml"
    f.write_text('run_id = "r1"\nmax_paths = 0\ncheckpoint_dir = "ckpt"\ninit_checkpoint = "/abs/sft"\nlr = 3e-5\n')
    cfg = TrainerConfig.from_toml(f)
    assert cfg.max_paths is None and cfg.checkpoint_dir == tmp_path / "ckpt"
    assert cfg.init_checkpoint == Path("/abs/sft") and cfg.lr == 3e-5 and cfg.run_id == "r1"


@pytest.mark.parametrize(
    "bad",
    [
        {"backend": "jax"},
        {"algorithm": "ppo-magic"},
        {"max_paths": -1},
        {"lr": 0.0},
        {"run_id": "a/b"},
        {"satellites": 2},  # satellites need streaming
        {"breaker_ratio": 0.0},
        {"no_such_knob": 1},
    ],
)
def test_invalid_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        TrainerConfig.from_dict(bad)


@pytest.mark.parametrize("bad", [{"lr": float("nan")}, {"lr": float("inf")}, {"weight_decay": float("nan")}])
def test_a_non_finite_number_is_refused_naming_its_key(bad: dict[str, object]) -> None:
    (key,) = bad
    with pytest.raises(ValueError, match=f"{key} must be a finite number"):
        TrainerConfig.from_dict(bad)
