"""The documentation's examples run: every ```python block marked ``<!-- example: runs as a test -->``."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- example: runs as a test -->"
_BLOCK = re.compile(re.escape(MARK) + r"\s*```python\n(.*?)```", re.S)


def examples() -> list[tuple[str, str]]:
    out = []
    for doc in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]):
        for i, code in enumerate(_BLOCK.findall(doc.read_text())):
            out.append((f"{doc.relative_to(ROOT)}#{i}", code))
    return out


def test_the_docs_hold_examples() -> None:
    assert examples(), f"no block marked {MARK!r}: the test below would prove nothing"


@pytest.mark.parametrize("code", [c for _, c in examples()], ids=[n for n, _ in examples()])
def test_a_documented_example_runs(code: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")  # its own asserts are the checks
    assert capsys.readouterr().out  # and it shows the reader something
