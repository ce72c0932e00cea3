"""Real agentic traces from our own loop: a short ``opengyre train loop`` on the CPU engine, exported as ATIF.

    .venv/bin/python svc-bench/bench/loop_atif.py --out svc-bench/bench/data/loop-atif.json

The run (written below as its RUN.toml): three skills' tasks (csv-report, text-cleanup, log-triage), one task
each, groups of 4, one step, on one CPU cell with the tiny model and the built-in reference harness (4 turns,
48 tokens per call, temperature 1, no sub-agents). Every execution's calls go through the proxy, which records
them; each execution is then exported with ``opengyre proxy atif`` (the proxy's own export, one trajectory per
execution) and the trajectories are written as one ATIF list. The per-token arrays (``prompt_token_ids``,
``completion_token_ids``, ``logprobs``) are dropped from each step's metrics to keep the file small: the bench
reads messages, timestamps and ``completion_tokens`` only. What the tiny untrained model writes is noise (it makes
no tool call), so each turn after the first is the harness's nudge; the prompts are the harness's real system
prompt and task instructions, the lengths and the timing those of a real rollout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OPENGYRE = Path(sys.executable).with_name("opengyre")
SKILLS = ("csv-report", "text-cleanup", "log-triage")
GROUP = 4
TOKEN_ARRAYS = ("prompt_token_ids", "completion_token_ids", "logprobs")


def run_toml(run_id: str, seed: int) -> str:
    skills = ", ".join(json.dumps(s) for s in SKILLS)
    return f"""run_id = {json.dumps(run_id)}
seed = {seed}
skills = {json.dumps(str(ROOT / "svc-synth" / "skills"))}
skill_names = [{skills}]
tasks_per_skill = 1
challenges = 1
level = 0
model = "tiny"
cells = 1
cell_capacity = {GROUP}
group_size = {GROUP}
groups_per_step = {len(SKILLS)}
steps = 1
policy = "colocate"
max_lag = 0
timeout_s = 300
harness = "builtin"
harness_args = ["--max-turns", "4", "--max-tokens", "48", "--temperature", "1.0", "--no-sub-agents"]
lr = 1e-4
"""


def strip(traj: dict[str, Any]) -> dict[str, Any]:
    for st in traj.get("steps", []):
        m = st.get("metrics")
        if isinstance(m, dict):
            for k in TOKEN_ARRAYS:
                m.pop(k, None)
    for sub in traj.get("subagent_trajectories") or []:
        strip(sub)
    return traj


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="the ATIF list to write")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    run_id = "atif"
    with tempfile.TemporaryDirectory(prefix="loop-atif-") as tmp:
        cfg, data = Path(tmp) / "run.toml", Path(tmp) / "data"
        cfg.write_text(run_toml(run_id, a.seed))
        subprocess.run([str(OPENGYRE), "train", "loop", str(cfg), "--data-dir", str(data)], check=True)
        # the loop's group ids are <run>-s<step>-g<k>, members <group>-m<i> (docs/loop.md)
        ids = [f"{run_id}-s1-g{g}-m{m}" for g in range(len(SKILLS)) for m in range(GROUP)]
        trajs = []
        for eid in ids:
            out = subprocess.run(
                [str(OPENGYRE), "proxy", "atif", eid, "--data-dir", str(data)], check=True, capture_output=True
            )
            trajs.append(strip(json.loads(out.stdout)))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(trajs, indent=1, ensure_ascii=False) + "\n")
    agent_steps = sum(1 for t in trajs for s in t["steps"] if s["source"] == "agent")
    print(f"wrote {a.out}: {len(trajs)} trajectories, {agent_steps} agent steps, {a.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
