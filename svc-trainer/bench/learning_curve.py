"""Learning is real: SFT then online RL on small programmatic tasks, through the whole system.

RL rollouts are harness calls (OpenAI chat) through the proxy gateway, which renders them to tokens, asks the
built-in CPU engine (SGLang ``/generate`` with logprobs) and records each call as ``ModelCallRecorded`` stamped
with the engine's weight version; every execution is scored and recorded as ``ExecutionFinished``; the
trainer's projection folds them, ``OnlineTrainer`` takes complete groups, trains one GRPO step, publishes a
checkpoint and hot-reloads the engine over ``/update_weights_from_disk``.

Task: single-digit addition ("7+5=" -> "12"). Reward 1 for the exact sum, partial credit for a number close to
it, 0 otherwise. SFT on golden answers first (a warm start that leaves room), then RL.

    .venv/bin/python svc-trainer/bench/learning_curve.py [--model tiny] [--out docs/trainer-learning-curve.png]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished
from opengyre.models import load_tokenizer, model_config
from opengyre.projection import ProjectionRunner
from opengyre.proxy import Gateway, GatewayConfig
from opengyre.proxy.engine import EngineConfig, EngineServer
from opengyre.runtime import EmbeddedNats
from opengyre.sandbox import SandboxLimits
from opengyre.store import create_db_engine, migrate, sqlite_url
from opengyre.trainer import (
    HarborVerifier,
    Learner,
    OnlineTrainer,
    TrainerConfig,
    TrainerProjection,
    TrainerStore,
    export_checkpoint,
    golden_tree,
    pack_samples,
    reload_engines,
    score_execution,
    sft_samples,
    write_checkpoint,
)
from opengyre.trainer.algorithms import SFT
from opengyre.trainer.backends import build_backend

IM_END = 258
PAIRS = [(a, b) for a in range(10) for b in range(10)]


def convo(a: int, b: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]


def reward(text: str, a: int, b: int) -> float:
    """The graders' rule in Python (for evaluation): whitespace ignored, exact sum 1, an integer of at most six
    digits within 5 of it partial credit, anything else 0."""
    t = "".join(text.split())
    if t == str(a + b):
        return 1.0
    if re.fullmatch(r"[0-9]{1,6}", t):
        return max(0.0, 0.5 * (1.0 - abs(int(t) - (a + b)) / 5.0))
    return 0.0


TEST_SH = """#!/bin/bash
# Grades /app/answer.txt: 1 for the exact sum, partial credit for an integer within 5 of it, else 0.
expected={expected}
got=$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)
if [ "$got" = "$expected" ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
if [[ "$got" =~ ^[0-9]{{1,6}}$ ]]; then
  d=$(( 10#$got > expected ? 10#$got - expected : expected - 10#$got ))
  awk -v d="$d" 'BEGIN {{ r = 0.5 * (1 - d / 5); if (r < 0) r = 0; print r }}' > /logs/verifier/reward.txt
  exit 0
fi
echo 0 > /logs/verifier/reward.txt
"""


def make_tasks(root: Path) -> dict[tuple[int, int], Path]:
    """One Harbor task per pair: instruction, verifier timeout, a grader in tests/ and a reference solution."""
    tasks = {}
    for a, b in PAIRS:
        t = root / f"add-{a}-{b}"
        (t / "tests").mkdir(parents=True)
        (t / "solution").mkdir()
        (t / "instruction.md").write_text(f"{a}+{b}=\n")
        (t / "task.toml").write_text('schema_version = "1.3"\n[verifier]\ntimeout_sec = 20.0\n')
        (t / "tests" / "test.sh").write_text(TEST_SH.format(expected=a + b))
        (t / "solution" / "solve.sh").write_text(f"echo {a + b} > /app/answer.txt\n")
        tasks[(a, b)] = t
    return tasks


class Rollouts:
    def __init__(self, url: str, tok: Any) -> None:
        self.url = url
        self.tok = tok
        self.prompts = {
            p: self.tok.encode(
                self.tok.apply_chat_template(convo(*p)[:1], tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )
            for p in PAIRS
        }

    async def one(self, client: httpx.AsyncClient, pair: tuple[int, int], seed: int) -> dict[str, Any]:
        body = {
            "input_ids": self.prompts[pair],
            "return_logprob": True,
            "sampling_params": {
                "max_new_tokens": 4,
                "temperature": 1.0,
                "stop_token_ids": [IM_END],
                "sampling_seed": seed,
            },
        }
        r = await client.post(self.url + "/generate", json=body)
        r.raise_for_status()
        data = r.json()
        meta = data["meta_info"]
        ids = [int(e[1]) for e in meta["output_token_logprobs"]]
        lps = [float(e[0]) for e in meta["output_token_logprobs"]]
        text = self.tok.decode([t for t in ids if t != IM_END])
        return {"pair": pair, "ids": ids, "lps": lps, "version": meta["weight_version"], "reward": reward(text, *pair)}

    async def many(self, jobs: list[tuple[tuple[int, int], int]]) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=120) as client:
            return list(await asyncio.gather(*(self.one(client, p, s) for p, s in jobs)))


async def harness(
    gateway: Gateway,
    members: list[tuple[str, str, tuple[int, int]]],
    tasks: dict[tuple[int, int], Path] | None,
    workspaces: Path,
) -> list[ExecutionFinished]:
    """One OpenAI chat call per execution through the proxy (its per-execution key); the reply is written to the
    execution's workspace and graded by the task's Harbor verifier in the local sandbox (or, with ``tasks``
    None, by the same rule in Python)."""
    verifier = HarborVerifier(SandboxLimits(timeout_s=20.0, memory_mb=512))
    graders = asyncio.Semaphore(4)

    async def one(client: httpx.AsyncClient, m: tuple[str, str, tuple[int, int]]) -> ExecutionFinished:
        eid, _, (a, b) = m
        r = await client.post(
            f"{gateway.base_url(eid)}/chat/completions",
            headers={"Authorization": f"Bearer {gateway.issue_key(eid)}"},
            json={"model": "opengyre-tiny", "messages": convo(a, b)[:1], "max_tokens": 4, "temperature": 1.0},
        )
        r.raise_for_status()
        text = r.json()["choices"][0]["message"]["content"] or ""
        if tasks is None:
            return ExecutionFinished(execution_id=eid, status="completed", score=reward(text, a, b))
        ws = workspaces / eid
        ws.mkdir(parents=True)
        (ws / "answer.txt").write_text(text)
        async with graders:
            return await asyncio.to_thread(score_execution, eid, verifier, tasks[(a, b)], ws)

    async with httpx.AsyncClient(timeout=120) as client:
        return list(await asyncio.gather(*(one(client, m) for m in members)))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--sft-steps", type=int, default=80)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--rl-steps", type=int, default=40)
    ap.add_argument("--rl-lr", type=float, default=1e-3)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups-per-step", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/trainer-learning-curve.png"))
    ap.add_argument(
        "--grader", choices=("harbor", "python"), default="harbor", help="Harbor verifier in the sandbox, or inline"
    )
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tok = load_tokenizer()
    work = Path(tempfile.mkdtemp(prefix="og-curve-"))
    tasks = make_tasks(work / "tasks") if args.grader == "harbor" else None
    nats = EmbeddedNats(work / "nats")
    url = nats.start()
    log = await EventLog.connect(url, LogConfig(stream="CURVE", prefix="curve.ev", blob_bucket="CURVEB"))
    db = create_db_engine(sqlite_url(work))
    migrate(db)
    stop = asyncio.Event()
    runner = ProjectionRunner(TrainerProjection(), log, db)
    fold = asyncio.create_task(runner.run(stop))
    curve: list[tuple[str, int, float]] = []  # (phase, step, eval reward)
    train_curve: list[tuple[int, float]] = []  # RL step -> mean rollout reward of the step
    t_start = time.perf_counter()
    try:
        async with EngineServer(EngineConfig(preset=args.model, seed=args.seed)) as engine:
            ro = Rollouts(engine.url, tok)
            eval_jobs = [(PAIRS[i % len(PAIRS)], 10_000 + i) for i in range(args.eval_samples)]

            async def evaluate() -> float:
                return float(statistics.mean(r["reward"] for r in await ro.many(eval_jobs)))

            # --- SFT warm start on golden answers -------------------------------------------------------
            backend = build_backend("torch", model_config(args.model), seed=args.seed)
            sft = Learner(backend, SFT(), lr=args.sft_lr)
            for step in range(args.sft_steps + 1):
                if step % args.eval_every == 0:
                    ck = write_checkpoint(backend, work / "ckpt", "sft", step)
                    [rl] = await reload_engines([engine.url], ck)
                    assert rl.success, rl.message
                    curve.append(("sft", step, await evaluate()))
                    print(f"sft step {step:4d}: eval reward {curve[-1][2]:.3f}", flush=True)
                if step == args.sft_steps:
                    break
                batch = [rng.choice(PAIRS) for _ in range(32)]
                trees = [golden_tree(f"g{i}", convo(*p), tok) for i, p in enumerate(batch)]
                await asyncio.to_thread(sft.step, pack_samples(sft_samples(trees), 8192))
            export_checkpoint(backend, work / "sft-final", "sft-final")

            # --- online RL through the event log ----------------------------------------------------------
            cfg = TrainerConfig(
                run_id="curve",
                model=args.model,
                algorithm="grpo",
                group_size=args.group_size,
                groups_per_step=args.groups_per_step,
                lr=args.rl_lr,
                micro_batch_tokens=8192,
                init_checkpoint=work / "sft-final",
                checkpoint_dir=work / "ckpt",
                engines=[engine.url],
                seed=args.seed,
            )
            trainer = OnlineTrainer(cfg, TrainerStore(db), log)
            gateway = Gateway(GatewayConfig(), event_log=log)
            await gateway.start()
            await gateway.pool.add("e0", engine.url)
            n = 0
            for step in range(1, args.rl_steps + 1):
                prompts = [rng.choice(PAIRS) for _ in range(args.groups_per_step)]
                members = []
                for g, p in enumerate(prompts):
                    for _ in range(args.group_size):
                        n += 1
                        members.append((f"x{n}", f"s{step}-g{g}", p))
                await log.append_many(
                    [
                        ExecutionDispatched(
                            execution_id=eid, task_id=f"add-{p[0]}-{p[1]}", group_id=gid, group_size=args.group_size
                        )
                        for eid, gid, p in members
                    ]
                )
                # The harness side: each execution asks the proxy (OpenAI chat), which records the call; then the
                # execution is graded and its outcome recorded.
                finished = await harness(gateway, members, tasks, work / "ws")
                await gateway.recorder.flush()
                await log.append_many(finished)
                results = [f.score or 0.0 for f in finished]
                await runner.wait_caught_up(60)
                report = await trainer.step_once()
                # No reload when no group had a reward spread (nothing to learn from): the weights did not change.
                assert report is not None and all(x.success for x in report.reloads)
                train_curve.append((step, statistics.mean(results)))
                gn = report.completed.metrics.get("grad_norm", 0.0)
                msg = f"rl step {step:4d}: rollout reward {train_curve[-1][1]:.3f}, grad norm {gn:.4f}"
                if step % args.eval_every == 0:
                    curve.append(("rl", args.sft_steps + step, await evaluate()))
                    msg += f", eval reward {curve[-1][2]:.3f}"
                print(msg, flush=True)
            await gateway.stop()
    finally:
        stop.set()
        await fold
        await log.close()
        nats.stop()
        shutil.rmtree(work, ignore_errors=True)  # tasks, workspaces, the log, a checkpoint per step
    elapsed = time.perf_counter() - t_start
    plot(curve, train_curve, args, elapsed)


def plot(curve: list[tuple[str, int, float]], train: list[tuple[int, float]], args: Any, elapsed: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    sft = [(s, r) for p, s, r in curve if p == "sft"]
    rl = [(s, r) for p, s, r in curve if p == "rl"]
    ax.plot(*zip(*sft, strict=True), "o-", color="tab:blue", label="eval reward, SFT")
    ax.plot(*zip(*([sft[-1], *rl]), strict=True), "o-", color="tab:red", label="eval reward, RL (GRPO)")
    ax.plot(
        [args.sft_steps + s for s, _ in train], [r for _, r in train], color="tab:red", alpha=0.35,
        label="rollout reward per RL step",
    )  # fmt: skip
    ax.axvline(args.sft_steps, color="gray", ls="--", lw=1)
    ax.set_xlabel("optimizer step (SFT, then RL)")
    ax.set_ylabel("mean reward")
    ax.set_title(f"single-digit addition, {args.model} model, CPU ({elapsed / 60:.1f} min)")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    print("| phase | step | eval reward |")
    print("| --- | --- | --- |")
    for p, s, r in curve:
        print(f"| {p} | {s} | {r:.3f} |")


if __name__ == "__main__":
    asyncio.run(main())
