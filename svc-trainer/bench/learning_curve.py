"""Learning is real: SFT then online RL on small programmatic tasks, through the whole system.

RL rollouts are harness calls (OpenAI chat) through the proxy gateway, which renders them to tokens, asks the
built-in CPU engine (SGLang ``/generate`` with logprobs) and records each call as ``ModelCallRecorded`` stamped
with the engine's weight version; every execution is scored and recorded as ``ExecutionFinished``; the
trainer's projection folds them, ``OnlineTrainer`` takes complete groups, trains one GRPO step, publishes a
checkpoint and hot-reloads the engine over ``/update_weights_from_disk``.

Task: single-digit addition ("7+5=" -> "12"). Reward 1 for the exact sum, partial credit for a number close to
it, 0 otherwise. SFT on golden answers first (a warm start that leaves room), then RL.

``--control``: after the SFT warm start, RL runs twice from the same weights: the treatment (``--rl-lr``) and a
control with a learning rate of ~0 (1e-12), through the same pipeline, with the same seeded evaluation; what the
treatment gains over the control is what RL learned, not evaluation noise or drift of the pipeline. Every RL
step prints its rollout reward, clip fraction and engine-trainer KL (``mismatch_kl``, where the trainer reports it).

    .venv/bin/python svc-trainer/bench/learning_curve.py [--model tiny] [--control] [--out docs/trainer-learning-curve.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished
from opengyre.models import load_tokenizer, model_config
from opengyre.projection import ProjectionRunner
from opengyre.proxy import Gateway, GatewayConfig
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
                "temperature": 1.0,  # evaluation always samples at 1, seeded: the same draws for every policy
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
    temperature: float = 1.0,
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
            json={"model": "opengyre-tiny", "messages": convo(a, b)[:1], "max_tokens": 4, "temperature": temperature},
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
    ap.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature")
    ap.add_argument("--control", action="store_true", help="also run RL with lr ~0 from the same SFT weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/trainer-learning-curve.png"))
    ap.add_argument(
        "--grader", choices=("harbor", "python"), default="harbor", help="Harbor verifier in the sandbox, or inline"
    )
    ap.add_argument("--replot", type=Path, help="draw --out again from the figures a run saved (<out>.json)")
    args = ap.parse_args()
    if args.replot is not None:
        saved = json.loads(args.replot.read_text())
        plot([tuple(x) for x in saved["curve"]], saved["train"], args, saved["elapsed"])
        return
    rng = random.Random(args.seed)
    tok = load_tokenizer()
    work = Path(tempfile.mkdtemp(prefix="og-curve-"))
    tasks = make_tasks(work / "tasks") if args.grader == "harbor" else None
    nats = EmbeddedNats(work / "nats")
    url = nats.start()
    stop = asyncio.Event()
    curve: list[tuple[str, int, float]] = []  # (phase, step, eval reward)
    train: dict[str, list[dict[str, float]]] = {}  # run -> per RL step: reward, clip fraction, KL, grad norm
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

            # --- online RL through the event log: the treatment, then the control ---------------------------
            runs = [("rl", args.rl_lr)] + ([("control", 1e-12)] if args.control else [])
            for run, lr in runs:
                # Each run has its own log and store: the control never sees the treatment's executions.
                log = await EventLog.connect(
                    url, LogConfig(stream=f"CURVE{run.upper()}", prefix=f"curve{run}.ev", blob_bucket=f"CURVEB{run}")
                )
                (work / run).mkdir()
                db = create_db_engine(sqlite_url(work / run))
                migrate(db)
                runner = ProjectionRunner(TrainerProjection(), log, db)
                fold = asyncio.create_task(runner.run(stop))
                cfg = TrainerConfig(
                    run_id=run,
                    model=args.model,
                    # The objective the recorded curves were run with (docs/benchmarks.md): clip-higher, one epoch.
                    algorithm="grpo",
                    algorithm_params={"eps_high": 0.28},
                    ppo_epochs=1,
                    group_size=args.group_size,
                    groups_per_step=args.groups_per_step,
                    lr=lr,
                    micro_batch_tokens=8192,
                    init_checkpoint=work / "sft-final",
                    checkpoint_dir=work / "ckpt",
                    engines=[engine.url],
                    seed=args.seed,
                )
                trainer = OnlineTrainer(cfg, TrainerStore(db), log)
                [rl] = await reload_engines([engine.url], ck_of(work, args, run))
                assert rl.success, rl.message
                gateway = Gateway(GatewayConfig(), event_log=log)
                await gateway.start()
                await gateway.pool.add("e0", engine.url)
                run_rng = random.Random(args.seed + 1)  # the same prompts for the treatment and the control
                steps: list[dict[str, float]] = []
                for step in range(1, args.rl_steps + 1):
                    prompts = [run_rng.choice(PAIRS) for _ in range(args.groups_per_step)]
                    members = [
                        (f"{run}-x{step}-{g}-{i}", f"{run}-s{step}-g{g}", p)
                        for g, p in enumerate(prompts)
                        for i in range(args.group_size)
                    ]
                    await log.append_many(
                        [
                            ExecutionDispatched(
                                execution_id=eid, task_id=f"add-{p[0]}-{p[1]}", group_id=gid,
                                group_size=args.group_size, weight_version=trainer_version(trainer),
                            )
                            for eid, gid, p in members
                        ]
                    )  # fmt: skip
                    # The harness side: each execution asks the proxy (OpenAI chat), which records the call; then
                    # the execution is graded and its outcome recorded.
                    finished = await harness(gateway, members, tasks, work / "ws" / run, args.temperature)
                    await gateway.recorder.flush()
                    await log.append_many(finished)
                    results = [f.score or 0.0 for f in finished]
                    await runner.wait_caught_up(60)
                    report = await trainer.step_once()
                    # No reload when no group had a reward spread (nothing to learn from): the weights did not change.
                    assert report is not None and all(x.success for x in report.reloads)
                    m = report.completed.metrics
                    steps.append(
                        {
                            "reward": statistics.mean(results),
                            "clip_fraction": m.get("clip_fraction", float("nan")),
                            "kl": m.get("mismatch_kl", float("nan")),
                            "grad_norm": m.get("grad_norm", 0.0),
                        }
                    )
                    msg = (
                        f"{run} step {step:4d}: rollout reward {steps[-1]['reward']:.3f}, clip fraction "
                        f"{steps[-1]['clip_fraction']:.4f}, engine-trainer KL {steps[-1]['kl']:.2e}, "
                        f"grad norm {steps[-1]['grad_norm']:.4f}"
                    )
                    if step % args.eval_every == 0:
                        curve.append((run, args.sft_steps + step, await evaluate()))
                        msg += f", eval reward {curve[-1][2]:.3f}"
                    print(msg, flush=True)
                train[run] = steps
                await gateway.stop()
                stop.set()
                await fold
                stop.clear()
                await log.close()
    finally:
        stop.set()
        nats.stop()
        shutil.rmtree(work, ignore_errors=True)  # tasks, workspaces, the log, a checkpoint per step
    elapsed = time.perf_counter() - t_start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = {"curve": curve, "train": train, "elapsed": elapsed}
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    plot(curve, train, args, elapsed)


def ck_of(work: Path, args: Any, run: str) -> Any:
    """The SFT weights every RL run starts from, as a checkpoint the engine loads (version ``<run>-s0``)."""
    from opengyre.models import load_checkpoint

    model, _ = load_checkpoint(work / "sft-final")
    backend = build_backend("torch", model.config, model.state_dict())
    return write_checkpoint(backend, work / "ckpt", run, 0)


def trainer_version(trainer: OnlineTrainer) -> str:
    return trainer.resumed_from or f"{trainer.config.run_id}-s{trainer.step_no}"


def plot(curve: list[Any], train: dict[str, list[dict[str, float]]], args: Any, elapsed: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    kx = bx.twinx()  # the KL on a log scale beside the clip fraction
    sft = [(s, r) for p, s, r in curve if p == "sft"]
    ax.plot(*zip(*sft, strict=True), "o-", color="tab:blue", label="eval reward, SFT")
    colours = {"rl": "tab:red", "control": "tab:gray"}
    names = {"rl": f"RL (GRPO, lr {args.rl_lr:g})", "control": "control (lr ~0)"}
    for run, steps in train.items():
        pts = [(s, r) for p, s, r in curve if p == run]
        ax.plot(*zip(*([sft[-1], *pts]), strict=True), "o-", color=colours[run], label=f"eval reward, {names[run]}")
        xs = [args.sft_steps + i + 1 for i in range(len(steps))]
        ax.plot(xs, [x["reward"] for x in steps], color=colours[run], alpha=0.3, label=f"rollout reward, {run}")
        bx.plot(xs, [x["clip_fraction"] for x in steps], color=colours[run], label=f"clip fraction, {run}")
        kl = [x["kl"] for x in steps]
        if not all(math.isnan(v) for v in kl):  # a trainer that does not report it (before the change) draws none
            # exactly 0 (a bit-exact engine) is drawn at the axis floor
            kx.plot(xs, [max(v, 1e-18) for v in kl], ":", color=colours[run], label=f"KL(engine || trainer), {run}")
    ax.axvline(args.sft_steps, color="gray", ls="--", lw=1)
    bx.set_xlabel("optimizer step (SFT), then RL step")
    ax.set_ylabel("mean reward")
    bx.set_ylabel("clip fraction (solid)")
    clips = [x["clip_fraction"] for st in train.values() for x in st if not math.isnan(x["clip_fraction"])]
    bx.set_ylim(0, max(0.05, max(clips, default=0.0) * 1.2))
    kx.set_yscale("log")
    kx.set_ylim(1e-18, 1e-1)
    kx.set_ylabel("KL(engine || trainer) (dotted)")
    ax.set_title(f"single-digit addition, {args.model} model, CPU ({elapsed / 60:.1f} min)")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8)
    bx.legend(loc="upper left", fontsize=8)
    if kx.get_legend_handles_labels()[0]:
        kx.legend(loc="upper right", fontsize=8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    print("| phase | step | eval reward |")
    print("| --- | --- | --- |")
    for p, s, r in curve:
        print(f"| {p} | {s} | {r:.3f} |")
    for run, steps in train.items():
        print(f"{run}: clip fraction per step", " ".join(f"{x['clip_fraction']:.3f}" for x in steps))
        print(f"{run}: engine-trainer KL per step", " ".join(f"{x['kl']:.1e}" for x in steps))


if __name__ == "__main__":
    asyncio.run(main())
