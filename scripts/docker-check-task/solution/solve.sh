#!/bin/bash
# The check's "agent": asks the tool service on the host (reached through the sandbox's egress bridge: the
# container has no network) which operation to apply, then writes the answer into the workspace.
set -euo pipefail
cd /app
python3 - <<'PY'
import json, math, os, urllib.request
op = urllib.request.urlopen(os.environ["TOOL_URL"] + "/operation", timeout=30).read().decode().strip()
nums = [int(line) for line in open("numbers.txt") if line.strip()]
value = sum(nums) if op == "sum" else math.prod(nums)
json.dump({"operation": op, "value": value}, open("result.json", "w"))
print(f"agent: {op} of {len(nums)} numbers = {value}")
PY
