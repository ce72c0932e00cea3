"""The run configuration: read strictly from TOML, checked before anything starts, each error naming its key."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from opengyre.harness import HARNESS_VERSIONS, builtin_spec, harness_preset
from opengyre.loop import RunConfig, RunConfigError, deployment_env, scheduler_env

SKILLS = Path(__file__).resolve().parents[3] / "svc-synth" / "skills"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


def test_a_run_file_is_read_with_its_paths_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "h.toml").write_text('name = "h"\nargv = ["{python}", "-c", "pass"]\n')
    cfg = RunConfig.from_toml(write(tmp_path, 'run_id = "r1"\ngroup_size = 2\nsteps = 3\nharness = "h.toml"\n'))
    assert (cfg.run_id, cfg.group_size, cfg.steps, cfg.harness) == ("r1", 2, 3, str(tmp_path / "h.toml"))
    env = scheduler_env(cfg)
    assert env["OPENGYRE_SCHEDULER_GROUP_SIZE"] == "2" and env["OPENGYRE_SCHEDULER_AUTO"] == "1"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("grup_size = 2\n", "grup_size"),  # a typo is not silently ignored
        ('group_size = "four"\n', "group_size"),
        ("steps = 0\n", r"steps must be >= 1"),
        ("group_size = 9\ngroups_per_step = 1\ncells = 2\ncell_capacity = 4\n", "does not fit"),
        ('run_id = "a/b"\n', "run_id"),
        ("level = 9\n", "level"),
        ('harness = "nowhere.toml"\n', "harness"),
        ("steps = \n", r"run\.toml"),
        ("timeout_s = nan\n", "timeout_s must be a finite number"),  # it reached the event log as null
        ("timeout_s = inf\n", "timeout_s must be a finite number"),
        ("lr = nan\n", "lr must be a finite number"),
        ("sft_lr = -inf\n", "sft_lr must be a finite number"),
        ('sandbox = "chroot"\n', "sandbox must be one of namespace, none"),
        ("group_memory_mb = 8\n", r"group_memory_mb must be 0 \(no shared budget\) or >= 16"),
        ('harness = "claude-cod"\n', r"harness must be 'builtin', a preset \(claude-code, codex, .*none of them"),
        ('harness = "codex"\nharness_args = ["--max-turns", "3"]\n', "harness_args are the built-in harness's"),
        ('cells = 2\nengines = ["http://127.0.0.1:1"]\n', r"engines: 1 given for 2 cell\(s\)"),
        ('cells = 1\nengines = ["127.0.0.1:1"]\n', r"engines: '127.0.0.1:1' is not an http\(s\) URL"),
        ('cells = 1\nengines = ["http://127.0.0.1:1"]\nsft_epochs = 1\n', "engines: a warm start's weights"),
    ],
)
def test_a_bad_run_file_is_refused_saying_why(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(RunConfigError, match=says):
        RunConfig.from_toml(write(tmp_path, text))


def test_a_missing_run_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RunConfigError, match=r"nope\.toml"):
        RunConfig.from_toml(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('model = "gpt-9"\n', r"model: unknown model 'gpt-9'"),
        ('policy = "nope"\n', r"policy: unknown policy 'nope'"),
        ('algorithm = "ppo-nope"\n', r"trainer settings: algorithm must be one of"),  # the trainer crash-looped
        ('algorithm = "dapo"\n', r"trainer settings: algorithm dapo samples dynamically"),  # it would wait forever
        ("micro_batch_tokens = 1\n", r"trainer settings: .*micro_batch_tokens >= 2"),
        ('skills = "/nonexistent/skills"\n', r"skills: /nonexistent/skills does not exist"),
        ('skill_names = ["no-such-skill"]\n', r"skill_names: no accepted skill\(s\) no-such-skill"),
        ('harness = "h.toml"\n', r"harness .*h\.toml: "),  # not TOML
        ('harness = "ph.toml"\n', r"unknown placeholder \{nosuch\}"),
    ],
)
def test_what_a_service_would_refuse_is_refused_before_any_starts(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "h.toml").write_text("this is not toml\n")
    (tmp_path / "ph.toml").write_text('name = "h"\nargv = ["{nosuch}"]\n')
    cfg = RunConfig.from_toml(write(tmp_path, text))  # each part alone is well-formed
    with pytest.raises(RunConfigError, match=says):
        cfg.check()


def test_a_preset_names_a_real_harness_run_as_pinned(tmp_path: Path) -> None:
    (tmp_path / "codex").write_text("not a spec\n")  # a file of a preset's name: the preset wins
    cfg = RunConfig.from_toml(write(tmp_path, 'harness = "codex"\n'))
    assert (cfg.harness, cfg.harness_kind) == ("codex", "preset")
    assert cfg.harness_spec() == harness_preset("codex")
    builtin = RunConfig().validate()
    assert builtin.harness_spec() == builtin_spec("--max-turns", "6")


def test_a_preset_whose_harness_is_not_installed_is_refused_saying_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no claude on it
    cfg = RunConfig.from_toml(write(tmp_path, 'harness = "claude-code"\nskill_names = ["csv-report"]\n'))
    with pytest.raises(RunConfigError) as err:
        cfg.check()
    assert str(err.value) == (
        "run config: harness: harness claude-code is not installed: `npm install -g @anthropic-ai/claude-code@"
        f"{HARNESS_VERSIONS['claude-code']['version']}` (`make harnesses` installs every pinned harness)"
    )


def test_a_good_run_file_passes_the_check(tmp_path: Path) -> None:
    cfg = RunConfig.from_toml(write(tmp_path, 'skill_names = ["csv-report"]\n'))
    assert cfg.check() is cfg


@pytest.mark.parametrize("run_id", ["a.b*c >", "x" * 25, "", "a/b"])
def test_a_run_id_the_ids_made_from_it_cannot_carry_is_refused(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(RunConfigError, match="run_id must be 1 to 24 of"):
        RunConfig.from_toml(write(tmp_path, f"run_id = {run_id!r}\n".replace("'", '"')))


def test_a_runs_sandbox_backend_is_its_harnesses_not_its_graders() -> None:
    """The graders (trainer) and gates (synth) run in the services' processes with their own backend: a run whose
    harnesses opt out of isolation (``none``) is still graded in the namespace sandbox, the only one that mounts
    /app, /tests and /logs (with ``none`` every grading would be a sandbox failure)."""
    assert "OPENGYRE_SANDBOX" not in deployment_env(RunConfig(sandbox="none").validate())
    assert "OPENGYRE_SANDBOX" not in deployment_env(RunConfig().validate())


def test_a_config_is_checked_once_and_an_equal_new_one_again(tmp_path: Path) -> None:
    """The CLI checks before anything starts and ``run_loop`` checks what it is given: the same object once."""
    skills = tmp_path / "skills"
    shutil.copytree(SKILLS / "csv-report", skills / "csv-report")
    cfg = RunConfig.from_toml(write(tmp_path, f'skills = "{skills}"\nskill_names = ["csv-report"]\n'))
    assert cfg.check() is cfg
    shutil.rmtree(skills)  # a second check that read the skills again would refuse now
    assert cfg.check() is cfg
    with pytest.raises(RunConfigError, match=r"skills: .* does not exist"):
        msgspec.structs.replace(cfg).check()  # an equal config, another object: checked in full
