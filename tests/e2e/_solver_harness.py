"""A scripted harness for the closed-loop test: it talks to the model through the proxy like any harness (two
chat turns with the official openai SDK, recorded by the proxy as a trajectory), then solves the task or not by
a fixed rule, so the rewards are known in advance and the hardening deterministic.

Rule: member ``m<i>`` of a group (the execution id ``<group>-m<i>`` is in its base URL) runs the task's reference
solution when ``i < --solved``, and leaves the workspace as it found it otherwise. ``--fault i:kind`` makes
member i misbehave instead, after its model calls: ``crash`` (exits 3 having half-written a file), ``hang``
(sleeps past any time limit), ``garbage`` (overwrites every workspace file and its summary file with bytes
that are no text). The reference solution is what the test handed it on purpose (``tests/e2e/_oracle.py``): under
``--answers``, the directory named by the SHA-256 of the instruction given, mounted read-only into its sandbox. The
data dir stays out of its reach: each ``--probe`` is a host path there (a task's reference solution) that it must
fail to open; where one opens, it says so and solves nothing, so the test's rewards fail.

    python _solver_harness.py --answers DIR --probe PATH --solved 3 --model M --instruction-file F
    (OPENAI_BASE_URL and OPENAI_API_KEY in the environment)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import openai


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--answers", type=Path, required=True)
    p.add_argument("--probe", type=Path, action="append", default=[], help="a host path it must not read")
    p.add_argument("--solved", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--instruction-file", type=Path, required=True)
    p.add_argument("--summary-file", type=Path)
    p.add_argument("--fault", action="append", default=[], help="i:crash|hang|garbage")
    args = p.parse_args()
    instruction = args.instruction_file.read_text()
    for probe in args.probe:
        try:
            with open(probe, "rb"):
                pass
        except OSError as exc:
            print(f"probe {probe}: unreadable ({type(exc).__name__})")
        else:
            print(f"ISOLATION BROKEN: the harness read {probe}", file=sys.stderr)
            return 9
    base_url = os.environ["OPENAI_BASE_URL"]
    client = openai.OpenAI(base_url=base_url, api_key=os.environ["OPENAI_API_KEY"], max_retries=3)
    msgs: list[dict[str, str]] = [{"role": "user", "content": instruction[:400]}]
    first = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=6, temperature=1.0)  # type: ignore[arg-type]
    msgs += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "go on"},
    ]
    client.chat.completions.create(model=args.model, messages=msgs, max_tokens=6, temperature=1.0)  # type: ignore[arg-type]
    found = re.search(r"/x/([^/]+)/v1", base_url)
    if found is None:
        print(f"no execution id in {base_url}", file=sys.stderr)
        return 2
    member = int(found.group(1).rsplit("-m", 1)[1])
    faults = dict(f.split(":", 1) for f in args.fault)
    if (fault := faults.get(str(member))) is not None:
        return misbehave(fault, args.summary_file)
    if member >= args.solved:
        return 0
    solution = args.answers / hashlib.sha256(instruction.encode()).hexdigest() / "solve.sh"
    if not solution.is_file():
        print(f"no answer for this instruction under {args.answers}", file=sys.stderr)
        return 2
    env = {**os.environ, "APP_DIR": os.getcwd()}
    return subprocess.run(["bash", str(solution)], env=env, check=False).returncode


def misbehave(fault: str, summary: Path | None) -> int:
    if fault == "crash":
        Path("partial.out").write_text("half")
        return 3
    if fault == "hang":
        time.sleep(3600)
        return 0
    if fault == "garbage":
        noise = bytes(range(256)) * 8
        for f in Path(".").rglob("*"):
            if f.is_file():
                f.write_bytes(noise)
        if summary is not None:
            summary.write_bytes(noise)
        return 0
    raise ValueError(f"unknown fault {fault!r}")


if __name__ == "__main__":
    sys.exit(main())
