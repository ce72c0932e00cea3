#!/bin/bash
# Grades /app/result.json; writes Harbor's /logs/verifier/reward.json (reward 1.0 when right, else 0.0).
mkdir -p /logs/verifier
python3 - <<'PY'
import json
try:
    got = json.load(open("/app/result.json"))
except (OSError, ValueError):
    got = None
want = {"operation": "product", "value": 3 * 5 * 7 * 11}
reward = 1.0 if got == want else 0.0
json.dump({"reward": reward}, open("/logs/verifier/reward.json", "w"))
print(f"verifier: got {got}, want {want}: reward {reward}")
PY
