"""Compile proto/opengyre/v1/*.proto into libs/opengyre/v1 (messages, gRPC stubs, mypy stubs).

``--check`` compiles into a temporary folder and fails if the committed code differs (CI runs it).
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO = ROOT / "proto"
OUT = ROOT / "libs"
BIN = Path(sys.executable).parent
GENERATED = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def compile_to(out: Path) -> list[Path]:
    files = sorted(PROTO.glob("opengyre/v1/*.proto"))
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *[str(f) for f in files],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out) for p in (out / "opengyre" / "v1").iterdir() if p.name.endswith(GENERATED))


def main() -> int:
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = compile_to(Path(tmp))
            committed = sorted(
                p.relative_to(OUT) for p in (OUT / "opengyre" / "v1").iterdir() if p.name.endswith(GENERATED)
            )
            stale = [
                str(p)
                for p in fresh
                if not (OUT / p).exists() or not filecmp.cmp(Path(tmp) / p, OUT / p, shallow=False)
            ]
            extra = [str(p) for p in committed if p not in fresh]
            if stale or extra:
                print(f"generated protobuf code is stale ({', '.join(stale + extra)}): run `make proto`")
                return 1
        print("generated protobuf code is up to date")
        return 0
    for p in (OUT / "opengyre" / "v1").glob("*"):
        if p.name.endswith(GENERATED):
            p.unlink()
    for p in compile_to(OUT):
        print(f"wrote libs/{p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
