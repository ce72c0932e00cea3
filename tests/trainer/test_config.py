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
        {"negative_weight": 0.0},
        {"algorithm": "dapo", "loss_aggregation": "execution-mean"},  # DAPO's loss is token-level
        {"algorithm": "dapo", "dynamic_sampling": False},  # and it samples dynamically
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


def test_an_algorithms_recipe_fills_what_is_unset_and_only_that() -> None:
    dapo = TrainerConfig.from_dict({"algorithm": "dapo"})
    assert dapo.aggregation == "token-mean" and dapo.uses_dynamic_sampling
    explicit = TrainerConfig.from_dict(
        {"algorithm": "dapo", "loss_aggregation": "token-mean", "dynamic_sampling": True}
    )
    assert explicit.aggregation == "token-mean" and explicit.uses_dynamic_sampling
    for name in ("grpo", "gspo"):  # no recipe: the trainer's own defaults, and any setting goes
        plain = TrainerConfig.from_dict({"algorithm": name})
        assert plain.aggregation == "execution-mean" and not plain.uses_dynamic_sampling
        token = TrainerConfig.from_dict({"algorithm": name, "loss_aggregation": "token-mean", "dynamic_sampling": True})
        assert token.aggregation == "token-mean" and token.uses_dynamic_sampling
