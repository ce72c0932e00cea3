"""Skill ingestion: the shipped examples pass the filters; malformed, unsafe and undeployable skills are refused with
a clear reason; nothing is written outside the output folder."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from opengyre.synth import DIMENSIONS, SkillLimits, ingest

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"
GOOD = """---
name: {name}
description: Summarise the numbers in a folder of CSV files and report the per-file totals with care.
metadata:
{meta}
---
# Steps

Read every file, check the header, add the amounts, and write one line per file with its total and name.
"""


def _skill(root: Path, name: str, text: str | None = None, meta: str = "  domain: test") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(text if text is not None else GOOD.format(name=name, meta=meta))
    return d


def test_the_shipped_examples_are_accepted_in_eight_domains(tmp_path: Path) -> None:
    report = ingest(EXAMPLES, tmp_path)
    assert not report.rejected, report.rejected
    assert len(report.accepted) >= 8
    assert len({s.domain for s in report.accepted}) >= 8
    for s in report.accepted:
        assert set(s.capabilities) == set(DIMENSIONS) and max(s.capabilities.values()) == 1.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("no front matter\n", "must start with '---'"),
        ("---\nname: [a\n---\nbody\n", "not YAML"),
        ("---\n- a\n- b\n---\nbody\n", "YAML mapping"),
        ("---\nname: bad-front\ndescription: x\nversion: 1.0.0\n---\nbody\n", "Unexpected key(s)"),
        ("---\nname: Bad_Name\ndescription: x\n---\nbody\n", "hyphen-case"),
        ("---\nname: other-name\ndescription: x\n---\nbody\n", "does not match its folder"),
        ("---\nname: bad-front\ndescription: a <b> tag\n---\nbody\n", "no '<' or '>'"),
    ],
)
def test_malformed_front_matter_is_rejected(tmp_path: Path, text: str, why: str) -> None:
    _skill(tmp_path / "in", "bad-front", text)
    report = ingest(tmp_path / "in", tmp_path / "out")
    assert not report.accepted
    assert why in report.rejected[0].reason and report.rejected[0].reason.startswith("malformed SKILL.md")


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (
            "  openclaw:\n    requires: {bins: [photoshop]}",
            "runtime incompatible: requires binaries the substrate lacks: photoshop",
        ),
        ("  openclaw:\n    os: [darwin]", "runtime incompatible: runs only on darwin"),
        ("  openclaw:\n    requires: {env: [STRIPE_KEY]}", "not deployable: needs secrets STRIPE_KEY"),
        ("  openclaw:\n    primaryEnv: OPENAI_API_KEY", "not deployable: needs secrets OPENAI_API_KEY"),
    ],
)
def test_the_three_filters_give_their_reason(tmp_path: Path, meta: str, why: str) -> None:
    _skill(tmp_path / "in", "filtered", meta=meta)
    report = ingest(tmp_path / "in", tmp_path / "out")
    assert [r.reason for r in report.rejected] == [why]


def test_network_and_thin_skills_are_rejected(tmp_path: Path) -> None:
    d = _skill(tmp_path / "in", "fetcher")
    (d / "scripts").mkdir()
    (d / "scripts" / "get.sh").write_text("curl -s https://api.example.com/data\n")
    _skill(tmp_path / "in", "thin", "---\nname: thin\ndescription: short\n---\nhi\n")
    reasons = {r.name: r.reason for r in ingest(tmp_path / "in", tmp_path / "out").rejected}
    assert reasons["fetcher"].startswith("not deployable: needs network access")
    assert reasons["thin"].startswith("no practical value")


def test_binary_oversized_and_linked_bundles_are_rejected(tmp_path: Path) -> None:
    (_skill(tmp_path / "in", "elf") / "tool").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 64)
    (_skill(tmp_path / "in", "blob") / "data.txt").write_bytes(b"abc\0def")
    (_skill(tmp_path / "in", "huge") / "big.txt").write_bytes(b"x" * 5000)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    os.symlink(secret, _skill(tmp_path / "in", "linker") / "link.txt")
    report = ingest(tmp_path / "in", tmp_path / "out", SkillLimits(max_file_bytes=4096))
    reasons = {r.name: r.reason for r in report.rejected}
    assert "binary executable" in reasons["elf"]
    assert "is binary" in reasons["blob"]
    assert "over 4096" in reasons["huge"]
    assert "links out of the skill folder" in reasons["linker"]


def _tar(path: Path, entries: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info in entries:
            tf.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _file(name: str, size: int = 1) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([_file("../escape.txt")], "escapes the folder"),
        ([_file("ok/../../escape.txt")], "escapes the folder"),
        ([_file("/etc/evil.txt")], "absolute path"),
        ([_link("s/link", "../../../etc/passwd")], "is a link"),
        ([_link("s/hard", "/etc/passwd", tarfile.LNKTYPE)], "is a link"),
    ],
)
def test_unsafe_tar_archives_are_rejected_and_write_nothing(
    tmp_path: Path, entries: list[tarfile.TarInfo], why: str
) -> None:
    archive = _tar(tmp_path / "bundle.tar.gz", entries)
    out = tmp_path / "work" / "out"
    out.mkdir(parents=True)
    before = sorted(p for p in tmp_path.rglob("*"))
    report = ingest(archive, out)
    assert not report.accepted and why in report.rejected[0].reason
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, inside or out


def test_unsafe_zip_entries_are_rejected(tmp_path: Path) -> None:
    for name, why in (("../x.txt", "escapes the folder"), ("/abs.txt", "absolute path")):
        z = tmp_path / "b.zip"
        with zipfile.ZipFile(z, "w") as zf:
            zf.writestr(name, "x")
        report = ingest(z, tmp_path / "out")
        assert why in report.rejected[0].reason
        z.unlink()
    z = tmp_path / "link.zip"
    with zipfile.ZipFile(z, "w") as zf:
        info = zipfile.ZipInfo("s/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    assert "is a link" in ingest(z, tmp_path / "out").rejected[0].reason
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_skills_from_zip_and_tar_gz_archives(tmp_path: Path) -> None:
    z = tmp_path / "skills.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for p in sorted(EXAMPLES.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(EXAMPLES.parent).as_posix())
    t = tmp_path / "skills.tar.gz"
    with tarfile.open(t, "w:gz") as tf:
        tf.add(EXAMPLES, arcname="skills")
    from_dir = {s.skill_id for s in ingest(EXAMPLES, tmp_path / "d").accepted}
    assert {s.skill_id for s in ingest(z, tmp_path / "z").accepted} == from_dir
    assert {s.skill_id for s in ingest(t, tmp_path / "t").accepted} == from_dir
    assert all(p.resolve().is_relative_to((tmp_path / "z").resolve()) for p in (tmp_path / "z").rglob("*"))


def test_re_ingesting_an_archive_drops_skills_no_longer_in_it_and_a_rejected_skill_is_not_extracted(
    tmp_path: Path,
) -> None:
    def bundle(names: list[str], bad: bool = False) -> Path:
        z = tmp_path / "bundle.zip"
        with zipfile.ZipFile(z, "w") as zf:
            for n in names:
                zf.writestr(f"skills/{n}/SKILL.md", GOOD.format(name=n, meta="  domain: test"))
            if bad:  # the name is not its folder's: rejected
                zf.writestr("skills/refused/SKILL.md", GOOD.format(name="other", meta="  domain: test"))
                zf.writestr("skills/refused/data.txt", "kept?")
        return z

    out = tmp_path / "out"
    first = ingest(bundle(["alpha-sums", "beta-sums"], bad=True), out)
    assert {s.name for s in first.accepted} == {"alpha-sums", "beta-sums"} and len(first.rejected) == 1
    assert not (out / "bundle" / "skills" / "refused").exists()  # the refused skill's files are not in the store
    assert (out / "bundle" / "skills" / "beta-sums" / "SKILL.md").is_file()
    (tmp_path / "bundle.zip").unlink()
    second = ingest(bundle(["alpha-sums"]), out)
    assert [s.name for s in second.accepted] == ["alpha-sums"]
    assert not (out / "bundle" / "skills" / "beta-sums").exists()  # gone with the archive that had it
    assert [p.name for p in out.iterdir()] == ["bundle"]  # no staging folder left
