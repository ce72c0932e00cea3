"""The warm start's cache: the same model, reference solutions and settings reuse the checkpoint of the first SFT
(run in a child process); any of them changed is trained again."""

from __future__ import annotations

from pathlib import Path

from opengyre.loop import TaskRef, sft_warm_start
from opengyre.models import checkpoint_info, load_checkpoint


def _task(root: Path, name: str, output: str) -> TaskRef:
    d = root / name
    (d / "solution").mkdir(parents=True)
    (d / "solution" / "solve.py").write_text(f"print({output!r})\n")
    (d / "environment" / "workspace").mkdir(parents=True)
    (d / "environment" / "workspace" / "data.txt").write_text("x\n")
    return TaskRef(task_id=name, version=1, task_dir=d, instruction=f"print {output}")


async def test_the_same_inputs_reuse_the_cached_checkpoint_and_changed_ones_train_again(tmp_path: Path) -> None:
    tasks = [_task(tmp_path / "tasks", "t1", "hello"), _task(tmp_path / "tasks", "t2", "world")]
    cache = tmp_path / "cache" / "warm-start"
    said: list[str] = []
    warm = sft_warm_start("tiny", epochs=1, lr=1e-3, seed=0, say=said.append, cache=cache)
    first = await warm(tasks, tmp_path / "run1" / "warm-start")
    assert first is not None and first.parent == cache
    info = checkpoint_info(first)
    assert info is not None and info["weight_version"] == "sft"
    assert any(line.startswith("warm start: SFT on 2 reference solution(s)") for line in said), said
    assert (tmp_path / "run1" / "warm-start" / "reference.jsonl").is_file()
    load_checkpoint(first)  # whole and verified

    said.clear()
    again = await warm(tasks, tmp_path / "run2" / "warm-start")  # another run, the same inputs
    assert again == first and checkpoint_info(again) == info
    assert said == [f"warm start: the same model, reference solutions and settings as before: {first} (no SFT)"]

    said.clear()
    other_lr = sft_warm_start("tiny", epochs=1, lr=2e-3, seed=0, say=said.append, cache=cache)
    third = await other_lr(tasks, tmp_path / "run3" / "warm-start")
    changed = await warm([tasks[0], _task(tmp_path / "tasks", "t3", "other")], tmp_path / "run4" / "warm-start")
    assert len({first, third, changed}) == 3 and sorted(p.name for p in cache.iterdir()) == sorted(
        p.name for p in (first, third, changed)
    )  # no temporary folder left behind
    assert sum(line.startswith("warm start: SFT on") for line in said) == 2
