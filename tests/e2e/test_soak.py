"""The soak run (bench/soak.py), short: recorded calls through the real stack while nats-server and the proxy
are SIGKILLed; every acknowledged call is recorded once and applied once by both projections."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Starts `opengyre up` stacks: listed in tests/_parallel.py (never two at once).

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_with_nats_server_and_proxy_killed_loses_and_doubles_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = [
        sys.executable,
        str(ROOT / "bench" / "soak.py"),
        "--duration", "45",
        "--fault-every", "15",
        "--targets", "nats-server,svc-proxy",
        "--services", "proxy,trainer",
        "--clients", "2",
        "--data-dir", str(tmp_path / "og"),
        "--progress-every", "15",
        "--json", str(out),
    ]  # fmt: skip
    res = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.exists(), res.stdout[-3000:] + res.stderr[-3000:]
    s = json.loads(out.read_text())
    said = res.stdout[-3000:]
    # Both faults happened, each to a live process, and calls were acknowledged after each.
    assert sorted(f["target"] for f in s["faults"]) == ["nats-server", "svc-proxy"], said
    assert all(f["pid"] > 0 and f["recovery_s"] is not None for f in s["faults"]), said
    assert s["acknowledged"] > 0 and s["serving_after_faults"] and s["drained"], said
    assert s["lost"] == 0 and s["doubled"] == 0, said
    assert s["applied_proxy"] == s["applied_trainer"] == s["acknowledged"], said
    assert res.returncode == 0, said
