"""Harbor task directories: ours round-trip through import; foreign ones import and run; bad ones say why."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from opengyre.synth import build_task, draft_blueprint, export_task, import_task, ingest, run_solution

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_an_exported_task_round_trips_through_import(tmp_path: Path) -> None:
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "skills").accepted if s.name == "log-triage")
    bp = draft_blueprint(
        skill_id=skill.skill_id,
        skill_name=skill.name,
        capabilities=skill.capabilities,
        seed=5,
        level=1,
    )
    built = build_task(bp)
    out = export_task(built, tmp_path / "export")
    conf = tomllib.loads((out / "task.toml").read_text())
    assert conf["schema_version"] == "1.3" and conf["task"]["name"] == f"opengyre/{bp.task_id}"
    assert conf["environment"]["network_mode"] == "no-network"
    assert {"instruction.md", "environment/Dockerfile", "solution/solve.sh", "tests/test.sh"} <= set(_files(out))
    # The grader and everything that gives answers away live under tests/ only.
    assert [p for p in _files(out) if p.endswith(("rubric.json", "grade.py", "blueprint.json"))] == [
        p for p in _files(out) if p.startswith("tests/") and p.endswith(("rubric.json", "grade.py", "blueprint.json"))
    ]
    imported = import_task(out, tmp_path / "imported")
    assert imported.blueprint == bp and imported.task_id == bp.task_id and imported.version == 1
    assert _files(imported.path) == built.files
    assert run_solution(imported.path, 'bash "$SOLUTION_DIR/solve.sh"\n').score == 1.0


def _foreign(root: Path) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solution").mkdir()
    (root / "task.toml").write_text(
        'schema_version = "1.3"\n[task]\nname = "acme/hello"\n[verifier]\ntimeout_sec = 30.0\n'
    )
    (root / "instruction.md").write_text("Write hello to /app/out.txt\n")
    (root / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/out.txt\n")
    (root / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif grep -qx hello /app/out.txt; then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return root


def test_a_foreign_harbor_task_imports_and_runs(tmp_path: Path) -> None:
    t = import_task(_foreign(tmp_path / "hello"))
    assert t.task_id == "acme--hello" and t.blueprint is None and t.has_solution
    assert run_solution(t.path, "echo hello > out.txt\n").score == 1.0
    assert run_solution(t.path, None).score == 0.0


def test_an_imported_tasks_reference_writing_absolute_app_paths_scores_one(tmp_path: Path) -> None:
    # Issue 28: a Harbor solve.sh names /app and /solution as they are in the task's container. With host paths
    # the reference wrote nowhere the grader looked and scored 0.0; the solution's sandbox has the real paths.
    root = _foreign(tmp_path / "hello")
    (root / "solution" / "solve.sh").write_text(
        '#!/bin/bash\nset -e\n[ "$APP_DIR" = /app ] && [ "$SOLUTION_DIR" = /solution ] && [ "$PWD" = /app ]\n'
        "cp /solution/hello.txt /app/hello.txt\ncp /app/hello.txt /app/out.txt\n"
    )
    (root / "solution" / "hello.txt").write_text("hello\n")
    (root / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif grep -qx hello /app/hello.txt && grep -qx hello /app/out.txt; then r=1; else r=0; fi\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    t = import_task(root)
    ref = run_solution(t.path, 'bash "$SOLUTION_DIR/solve.sh"\n')
    assert (ref.score, ref.failure_class) == (1.0, None), ref.detail
    assert run_solution(t.path, "bash /solution/solve.sh\n").score == 1.0
    assert run_solution(t.path, None).score == 0.0


def test_the_solution_cannot_write_its_solution_or_see_the_tests(tmp_path: Path) -> None:
    t = import_task(_foreign(tmp_path / "hello"))
    probe = (
        "echo x > /solution/solve.sh && exit 3\n"  # read-only
        "[ -e /tests ] && exit 4\n"  # the grader's tests come only after, to the grader
        f"[ -e {t.path} ] && exit 5\n"  # nor the task's directory on the host
        f"env | grep -qF -e {t.path} -e og-synth-ws && exit 6\n"  # no host path of the task or its copy in the env
        "echo hello > out.txt\n"
    )
    out = run_solution(t.path, probe)
    assert (out.score, out.solve_exit) == (1.0, 0), out.detail


@pytest.mark.parametrize(
    ("breakage", "why"),
    [
        (lambda r: (r / "task.toml").unlink(), "no task.toml"),
        (lambda r: (r / "tests" / "test.sh").unlink(), "no tests/test.sh"),
        (lambda r: (r / "environment" / "Dockerfile").unlink(), "no environment/Dockerfile"),
        (lambda r: (r / "task.toml").write_text("[task]\nname = 'no-org'\n"), "is not org/name"),
        (lambda r: (r / "task.toml").write_text("[task\n"), "does not parse"),
    ],
)
def test_a_broken_task_directory_is_refused(tmp_path: Path, breakage: object, why: str) -> None:
    root = _foreign(tmp_path / "t")
    breakage(root)  # type: ignore[operator]
    with pytest.raises(ValueError, match=why):
        import_task(root)


def test_a_kept_workspace_holds_only_bounded_regular_files(tmp_path: Path) -> None:
    t = import_task(_foreign(tmp_path / "hello"))
    script = "echo hello > out.txt; mkfifo pipe; ln -s /etc/hostname host; head -c 2000000 /dev/zero > big\n"
    out = run_solution(t.path, script, keep_workspace=True)
    assert out.score == 1.0 and out.workspace == {"out.txt": b"hello\n"}


def _multi_step(root: Path) -> Path:
    root = _foreign(root)
    (root / "instruction.md").unlink()
    (root / "task.toml").write_text(
        'schema_version = "1.3"\n[task]\nname = "acme/steps"\n[environment]\nworkdir = "/app"\n'
        '[[steps]]\nname = "scaffold"\nmin_reward = 1.0\n[steps.agent]\ntimeout_sec = 60.0\n'
        '[[steps]]\nname = "implement"\n[steps.verifier]\ntimeout_sec = "30"\n'  # Harbor coerces a numeric string
    )
    for step in ("scaffold", "implement"):
        (root / "steps" / step / "tests").mkdir(parents=True)
        (root / "steps" / step / "instruction.md").write_text(f"Do the {step} step\n")
    (root / "steps" / "implement" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


def test_a_multi_step_harbor_task_is_accepted_and_refused_on_the_host_with_why(tmp_path: Path) -> None:
    t = import_task(_multi_step(tmp_path / "steps"))
    assert t.steps == ("scaffold", "implement") and t.instruction == "Do the scaffold step\n"
    assert any("2 steps share one container" in n for n in t.container_needs), t.container_needs
    out = run_solution(t.path, "echo hello > out.txt\n")
    assert (out.score, out.failure_class) == (None, "needs-container") and "2 steps" in out.detail, out


@pytest.mark.parametrize(
    ("toml", "why"),
    [
        ('[task]\nname = "acme/x"\n[environment]\nnetwork_mode = "offline"\n', "network_mode = 'offline' is not one"),
        ('[task]\ndescription = "no name"\n', r"\[task\] has no name"),
        ('[task]\nname = "acme/x"\n[verifier]\ntimeout_sec = "soon"\n', "verifier.timeout_sec = 'soon' is not a number"),
        ('[task]\nname = "acme/x"\n[agent]\ntimeout_sec = -5\n', "is not a positive number"),
        ('[task]\nname = "acme/x"\n[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 2\n',
         "'shared' with a verifier.environment"),
        ('[task]\nname = "acme/x"\n[verifier]\nenvironment_mode = "elsewhere"\n', "is not shared or separate"),
        ('[task]\nname = "acme/x"\n[[steps]]\nmin_reward = 1.0\n', r"steps\[0\] has no valid name"),
        ('[task]\nname = "acme/x"\n[[steps]]\nname = "missing"\n', "no steps/missing/instruction.md"),
    ],
)  # fmt: skip
def test_a_task_harbor_rejects_is_refused_with_why(tmp_path: Path, toml: str, why: str) -> None:
    root = _foreign(tmp_path / "t")
    (root / "task.toml").write_text(toml)
    with pytest.raises(ValueError, match="Harbor refuses this task: .*" + why):
        import_task(root)


@pytest.mark.parametrize(
    ("change", "need"),
    [
        (lambda r: (r / "environment" / "Dockerfile").write_text(
            "FROM python:3.12-slim\nWORKDIR /app\nRUN echo hello > /app/seed.txt\n"), "Dockerfile line 3"),
        (lambda r: (r / "environment" / "Dockerfile").write_text(
            "FROM python:3.12-slim\nRUN apt-get update && apt-get install -y no-such-tool-here\n"),
         "installs no-such-tool-here, which the host lacks"),
        (lambda r: (r / "task.toml").write_text(
            '[task]\nname = "acme/hello"\n[verifier]\nenvironment_mode = "separate"\n'), "separate environment"),
        (lambda r: (r / "task.toml").write_text(
            '[task]\nname = "acme/hello"\n[environment]\ndocker_image = "acme/img:1"\n'), "docker_image"),
    ],
)  # fmt: skip
def test_a_task_that_needs_its_container_is_refused_on_the_host_not_scored(
    tmp_path: Path, change: object, need: str
) -> None:
    # Issue 28: run on the host without what its Dockerfile or separate verifier gives it, a valid task's own
    # reference scored 0.0, reported as a valid score. Refused, with why, it is no score at all.
    root = _foreign(tmp_path / "hello")
    change(root)  # type: ignore[operator]
    t = import_task(root)
    assert any(need in n for n in t.container_needs), t.container_needs
    ref = run_solution(t.path, 'bash "$SOLUTION_DIR/solve.sh"\n')
    assert (ref.score, ref.failure_class) == (None, "needs-container") and need in ref.detail, ref
