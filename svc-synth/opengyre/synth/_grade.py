"""The task's grader, shipped as ``tests/grade.py`` (stdlib only: it runs in the task's substrate).

Usage: ``python3 grade.py RUBRIC.json WORKSPACE REWARD.json``. Writes Harbor's ``reward.json``: ``reward`` (the
weighted mean over judged items) and ``item.<id>`` per item; ``unjudged_items`` counts LLM-judged items left out
because no judge is configured. Reads only regular files of bounded size: a symlink planted by the solver
(to /dev/zero, outside the workspace) scores the item 0 instead of hanging or exhausting the grader.
"""

GRADER_SOURCE = r"""
import json, os, subprocess, sys

MAX = 1 << 20

def read(ws, rel):
    path = os.path.join(ws, rel)
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > MAX:
        return None
    with open(path, "rb") as f:
        return f.read(MAX).decode("utf-8", "replace")

def check(item, ws):
    kind = item["kind"]
    if kind == "json_equals":
        text = read(ws, item["file"])
        try:
            data = json.loads(text) if text is not None else None
        except ValueError:
            return 0.0
        return 1.0 if isinstance(data, dict) and data.get(item["key"]) == item["expected"] else 0.0
    if kind == "json_constraint":
        text = read(ws, item["file"])
        try:
            data = json.loads(text) if text is not None else None
        except ValueError:
            return 0.0
        c = item["constraint"]
        if not isinstance(data, dict) or not all(
            type(data.get(v)) is int and c["lo"] <= data[v] <= c["hi"] for v in c["vars"]
        ):
            return 0.0
        lhs = sum(k * data[v] for k, v in zip(c["coef"], c["vars"]))
        ok = {"==": lhs == c["rhs"], "<=": lhs <= c["rhs"], ">=": lhs >= c["rhs"]}[c["op"]]
        return 1.0 if ok else 0.0
    if kind == "text_equals":
        text = read(ws, item["file"])
        return 1.0 if text is not None and text.strip() == item["expected"].strip() else 0.0
    if kind == "command":
        try:
            p = subprocess.run(item["argv"], cwd=ws, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return 0.0
        if p.returncode != 0:
            return 0.0
        want = item.get("expect_stdout")
        return 1.0 if want is None or p.stdout.decode("utf-8", "replace").strip() == want.strip() else 0.0
    raise ValueError("unknown rubric kind " + repr(kind))

def main():
    rubric_path, ws, out = sys.argv[1:4]
    with open(rubric_path) as f:
        items = json.load(f)["items"]
    scores, total, got, unjudged = {}, 0.0, 0.0, 0
    for item in items:
        if item["kind"] == "judge":
            unjudged += 1
            continue
        s = check(item, ws)
        scores["item." + item["id"]] = s
        total += item["weight"]
        got += item["weight"] * s
    result = {"reward": round(got / total, 6) if total else 0.0, "unjudged_items": unjudged}
    result.update(scores)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, sort_keys=True)

main()
"""

TEST_SH = """#!/bin/bash
# Grades the workspace (/app) against the rubric; writes /logs/verifier/reward.json.
mkdir -p /logs/verifier
python3 /tests/grade.py /tests/rubric.json /app /logs/verifier/reward.json
"""

__all__ = ["GRADER_SOURCE", "TEST_SH"]
