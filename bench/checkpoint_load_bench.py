"""Loading a checkpoint as an engine does at start: copied (``load_checkpoint``) against mapped from the file
(``load_checkpoint(share=True)``), SmolLM2-135M's shape (random weights; the cost depends on shapes, not values).

    .venv/bin/python bench/checkpoint_load_bench.py [--layers 30] [--repeats 3]

Each load runs in a fresh child process (``ru_maxrss`` is a process's high-water mark), after the checkpoint was
read once so the page cache holds it for both (as for the second engine of a run). Per variant: the CPU time of the
load (digest verification included), the peak RSS of the process and its rise over the imports, and the private
(anonymous) memory left after it: what one more engine costs. Ratios are shared / copied, medians of the repeats.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(directory: Path, share: bool) -> dict[str, float]:
    import torch

    from opengyre.models import load_checkpoint

    torch.set_num_threads(1)
    before = _status("VmRSS")
    c0, w0 = time.process_time(), time.perf_counter()
    model, _ = load_checkpoint(directory, share=share)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.no_grad():  # the model works: one forward, as an engine's first request
        model(torch.zeros(1, 8, dtype=torch.long))
    return {"cpu_s": cpu, "wall_s": wall, "peak_mb": peak, "rise_mb": peak - before, "anon_mb": _status("RssAnon")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--share", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.share)))
        return
    from transformers import LlamaConfig

    from opengyre.models import build_model, save_checkpoint

    cfg = LlamaConfig(
        vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_hidden_layers=args.layers,
        num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, max_position_embeddings=8192,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    with tempfile.TemporaryDirectory(prefix="og-ckpt-bench-") as tmp:
        ckpt = Path(tmp) / "ckpt"
        save_checkpoint(build_model(cfg, seed=0), ckpt, "bench")
        size = (ckpt / "model.safetensors").stat().st_size
        (ckpt / "model.safetensors").read_bytes()  # into the page cache for both variants
        runs: dict[str, list[dict[str, float]]] = {"copied": [], "shared": []}
        for _ in range(args.repeats):  # interleaved: both see the same machine load
            for name in runs:
                cmd = [sys.executable, __file__, "--child", str(ckpt)] + (["--share"] if name == "shared" else [])
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[name].append(json.loads(out.strip().splitlines()[-1]))
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    print(
        f"checkpoint of {size / 2**20:.0f} MiB ({args.layers} layers, SmolLM2-135M's shape), medians of {args.repeats}"
    )
    print("| load | CPU s | wall s | peak RSS MB | rise over imports MB | private (anon) RSS after MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n, m in med.items():
        print(
            f"| {n} | {m['cpu_s']:.2f} | {m['wall_s']:.2f} | {m['peak_mb']:,.0f} | {m['rise_mb']:,.0f} | "
            f"{m['anon_mb']:,.0f} |"
        )
    c, s = med["copied"], med["shared"]
    print(
        f"shared / copied: CPU {s['cpu_s'] / c['cpu_s']:.2f}x, peak RSS {s['peak_mb'] / c['peak_mb']:.2f}x, "
        f"rise {s['rise_mb'] / c['rise_mb']:.2f}x, private RSS after {s['anon_mb'] / c['anon_mb']:.2f}x"
    )


if __name__ == "__main__":
    main()
