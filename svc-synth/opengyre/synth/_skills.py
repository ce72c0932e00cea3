"""Skill ingestion: Agent Skills folders (SKILL.md front matter, ClawHub's ``metadata.openclaw``) from a directory,
a ``.zip`` or a ``.tar.gz``; safe extraction; the paper's three filters; capability requirements per skill.

Archives are checked whole before anything is written: an entry with ``..``, an absolute path, a link, a
device, an oversized member or an oversized total rejects the bundle, and files are then written one by one
under the output folder only (never ``extractall``). Every rejection carries its reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from ._pattern import DIMENSIONS

__all__ = [
    "SUBSTRATE_BINS",
    "IngestReport",
    "Rejection",
    "Skill",
    "SkillLimits",
    "derive_capabilities",
    "ingest",
    "keep_skill",
    "kept_skill",
    "read_skill_files",
]

# What the execution substrate (python:3.12-slim plus the apt packages the Dockerfile may add) provides.
SUBSTRATE_BINS = frozenset(
    [
        "bash",
        "sh",
        "python3",
        "python",
        "tar",
        "gzip",
        "gunzip",
        "sed",
        "grep",
        "awk",
        "sort",
        "uniq",
        "cut",
        "head",
        "tail",
        "wc",
        "cat",
        "find",
        "xargs",
        "tr",
        "diff",
        "cmp",
        "cp",
        "mv",
        "rm",
        "mkdir",
        "ls",
        "chmod",
        "ln",
        "date",
        "sleep",
        "env",
        "test",
        "printf",
        "echo",
        "unzip",
        "zip",
        "git",
        "jq",
        "sqlite3",
        "patch",
    ]
)
_SKILL_FILES = ("SKILL.md", "skill.md", "skills.md")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_ALLOWED_KEYS = {"name", "description", "license", "allowed-tools", "metadata", "compatibility"}
_NAME = re.compile(r"^[a-z0-9-]+$")
_FRONT = re.compile(r"^---\n(.*?)\n---", re.DOTALL)
_NET = re.compile(r"https?://(?!localhost|127\.0\.0\.1)[\w.-]+|\b(curl|wget)\s+(-\S+\s+)*https?://(?!localhost|127\.)")
_MAGIC = (b"\x7fELF", b"MZ", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")


@dataclass(frozen=True)
class SkillLimits:
    max_file_bytes: int = 5 << 20
    max_total_bytes: int = 50 << 20  # ClawHub's bundle cap
    max_files: int = 2000


@dataclass(frozen=True)
class Skill:
    skill_id: str
    name: str
    description: str
    body: str
    path: Path
    digest: str
    license: str
    domain: str
    requires_bins: tuple[str, ...]
    capabilities: dict[str, float]
    files: tuple[str, ...]


def read_skill_files(skill: Skill) -> dict[str, bytes]:
    """The skill's files (``Skill.files``, as ingested), by skill-relative path: what travels with its tasks.
    They must still be what was ingested (``Skill.digest``): a folder edited since is refused, not shipped under
    the old skill id."""
    files = {rel: (skill.path / rel).read_bytes() for rel in skill.files}
    if _digest(files) != skill.digest:
        raise ValueError(
            f"skill {skill.name}: its files at {skill.path} changed since it was ingested; ingest it again"
        )
    return files


def keep_skill(skill: Skill, root: Path) -> Path:
    """A copy of an accepted skill's files at ``root/<digest>/<name>/``, made once (written beside, then renamed
    into place): the store's own copy, from which a service builds tasks by the digest its catalogue holds."""
    dest = Path(root) / skill.digest / skill.name
    if dest.is_dir():
        return dest
    Path(root).mkdir(parents=True, exist_ok=True)
    stage = Path(root) / f".{skill.digest}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        for rel, data in read_skill_files(skill).items():
            (stage / skill.name / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / skill.name / rel).write_bytes(data)
        with contextlib.suppress(OSError):  # another process kept the same digest first
            stage.rename(dest.parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return dest


def kept_skill(root: Path, digest: str, name: str, limits: SkillLimits | None = None) -> Skill | None:
    """The skill ``keep_skill`` kept for ``digest``, read again and checked to have that digest; None if none."""
    d = Path(root) / digest / name
    if not _DIGEST.fullmatch(digest) or not _NAME.fullmatch(name) or not d.is_dir():
        return None
    found = _load_skill(d, limits or SkillLimits())
    return found if isinstance(found, Skill) and found.digest == digest else None


def _digest(files: dict[str, bytes]) -> str:
    return hashlib.sha256(b"".join(k.encode() + b"\0" + v for k, v in sorted(files.items()))).hexdigest()


@dataclass(frozen=True)
class Rejection:
    source: str  # the skill folder or archive entry it came from
    name: str  # the skill's name where it could be read, else the folder's
    reason: str
    digest: str = ""


@dataclass
class IngestReport:
    accepted: list[Skill] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)


class _Unsafe(ValueError):
    pass


def ingest(source: Path, out_dir: Path, limits: SkillLimits | None = None) -> IngestReport:
    """Read every skill under ``source`` (a folder, .zip or .tar.gz), extracting archives into ``out_dir``."""
    limits = limits or SkillLimits()
    source, out_dir = Path(source), Path(out_dir)
    report = IngestReport()
    if source.is_file():
        stem = source.name.removesuffix(".gz").removesuffix(".tar").removesuffix(".zip").removesuffix(".tgz")
        target = out_dir / stem
        try:
            entries = _read_archive(source, limits)
        except (_Unsafe, tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as exc:
            report.rejected.append(Rejection(str(source), stem, f"unsafe or unreadable archive: {exc}"))
            return report
        # Written whole beside the last extraction, then swapped in: a skill no longer in the archive does not
        # linger from the last ingest of it.
        stage = out_dir / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            _write_entries(entries, stage)
            shutil.rmtree(target, ignore_errors=True)
            stage.rename(target)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        root = target
    elif source.is_dir():
        root = source
    else:
        raise FileNotFoundError(f"no skill folder or archive at {source}")
    refused = []
    for skill_dir in _skill_dirs(root):
        result = _load_skill(skill_dir, limits)
        (report.rejected if isinstance(result, Rejection) else report.accepted).append(result)  # type: ignore[arg-type]
        if isinstance(result, Rejection):
            refused.append(skill_dir)
    if root is not source:
        # What we extracted of a rejected skill goes (a user's own folder is never touched): a refused skill's
        # files must not sit in the store as if they were usable.
        for d in refused:
            _remove_rejected(d, report.accepted)
    if not report.accepted and not report.rejected:
        report.rejected.append(Rejection(str(source), source.name, "no SKILL.md found"))
    return report


def _remove_rejected(skill_dir: Path, accepted: list[Skill]) -> None:
    if any(s.path.is_relative_to(skill_dir) for s in accepted):  # an accepted skill nested inside stays whole
        for p in skill_dir.iterdir():
            if p.is_file() or p.is_symlink():
                p.unlink()
        return
    shutil.rmtree(skill_dir, ignore_errors=True)


def _check_name(name: str, limits: SkillLimits) -> PurePosixPath:
    p = PurePosixPath(name)
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or "\\" in name:
        raise _Unsafe(f"entry {name!r} has an absolute path")
    if ".." in p.parts:
        raise _Unsafe(f"entry {name!r} escapes the folder (..)")
    return p


def _read_archive(path: Path, limits: SkillLimits) -> dict[PurePosixPath, bytes]:
    entries: dict[PurePosixPath, bytes] = {}
    total = 0

    def add(name: str, size: int, read: Any) -> None:
        nonlocal total
        p = _check_name(name, limits)
        if size > limits.max_file_bytes:
            raise _Unsafe(f"entry {name!r} is {size} bytes, over {limits.max_file_bytes}")
        data = read()
        if len(data) > limits.max_file_bytes:  # the declared size lied (a bomb)
            raise _Unsafe(f"entry {name!r} inflates past {limits.max_file_bytes} bytes")
        total += len(data)
        if total > limits.max_total_bytes:
            raise _Unsafe(f"the bundle is over {limits.max_total_bytes} bytes")
        if len(entries) >= limits.max_files:
            raise _Unsafe(f"the bundle has more than {limits.max_files} files")
        entries[p] = data

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise _Unsafe(f"entry {info.filename!r} is a link")
                if info.is_dir():
                    _check_name(info.filename, limits)
                    continue
                add(info.filename, info.file_size, lambda i=info: zf.open(i).read(limits.max_file_bytes + 1))
    else:
        with tarfile.open(path, "r:*") as tf:
            for m in tf.getmembers():
                if m.issym() or m.islnk():
                    raise _Unsafe(f"entry {m.name!r} is a link (to {m.linkname!r})")
                if m.isdir():
                    _check_name(m.name, limits)
                    continue
                if not m.isfile():
                    raise _Unsafe(f"entry {m.name!r} is not a regular file")
                add(m.name, m.size, lambda m=m: tf.extractfile(m).read(limits.max_file_bytes + 1))  # type: ignore[union-attr]
    return entries


def _write_entries(entries: dict[PurePosixPath, bytes], target: Path) -> None:
    base = target.resolve()
    for rel, data in entries.items():
        dest = (target / rel).resolve()
        if not dest.is_relative_to(base):  # checked names cannot get here; the guard stays for what they miss
            raise _Unsafe(f"entry {rel} resolves outside {target}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


def _skill_dirs(root: Path) -> list[Path]:
    found = {p.parent for name in _SKILL_FILES for p in root.rglob(name) if p.is_file()}
    return sorted(found)


def _load_skill(d: Path, limits: SkillLimits) -> Skill | Rejection:
    src = str(d)
    try:
        files = _bundle(d, limits)
    except _Unsafe as exc:
        return Rejection(src, d.name, str(exc))
    digest = _digest(files)
    md_name = next(n for n in _SKILL_FILES if n in files)
    try:
        text = files[md_name].decode("utf-8")
        front, body = _front_matter(text)
        name, desc = _validate_front(front, d.name)
    except (ValueError, UnicodeDecodeError) as exc:
        return Rejection(src, d.name, f"malformed SKILL.md: {exc}", digest)
    meta = front.get("metadata") or {}
    claw = _claw(meta)
    requires = claw.get("requires") or {}
    bins = tuple(str(b) for b in requires.get("bins") or ())
    why = _filters(desc, body, files, claw, requires, bins)
    if why:
        return Rejection(src, name, why, digest)
    domain = str(meta.get("domain", "")) if isinstance(meta, dict) else ""
    return Skill(
        skill_id=f"{name}-{digest[:10]}",
        name=name,
        description=desc,
        body=body,
        path=d,
        digest=digest,
        license=str(front.get("license", "")),
        domain=domain,
        requires_bins=bins,
        capabilities=derive_capabilities(desc + "\n" + body, files),
        files=tuple(sorted(files)),
    )


def _bundle(d: Path, limits: SkillLimits) -> dict[str, bytes]:
    base = d.resolve()
    files: dict[str, bytes] = {}
    total = 0
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if p.is_symlink():
            target = p.resolve()
            if not target.is_relative_to(base):
                raise _Unsafe(f"{rel} links out of the skill folder (to {target})")
            continue
        if not p.is_file():
            continue
        size = p.stat().st_size
        if size > limits.max_file_bytes:
            raise _Unsafe(f"{rel} is {size} bytes, over {limits.max_file_bytes}")
        total += size
        if total > limits.max_total_bytes:
            raise _Unsafe(f"the bundle is over {limits.max_total_bytes} bytes")
        data = p.read_bytes()
        if data.startswith(_MAGIC):
            raise _Unsafe(f"{rel} is a binary executable")
        if not rel.startswith("assets/") and b"\0" in data[:8192]:
            raise _Unsafe(f"{rel} is binary (only assets/ may hold binary files)")
        files[rel] = data
    return files


def _front_matter(text: str) -> tuple[dict[str, Any], str]:
    if not text.startswith("---"):
        raise ValueError("SKILL.md must start with '---' front matter")
    m = _FRONT.match(text)
    if not m:
        raise ValueError("front matter is not closed by '---'")
    try:
        front = yaml.safe_load(m.group(1))
    except yaml.YAMLError as exc:
        raise ValueError(f"front matter is not YAML: {exc}") from None
    if not isinstance(front, dict):
        raise ValueError("front matter must be a YAML mapping")
    return front, text[m.end() :].strip()


def _validate_front(front: dict[str, Any], folder: str) -> tuple[str, str]:
    unexpected = set(front) - _ALLOWED_KEYS
    if unexpected:
        raise ValueError(f"Unexpected key(s) in front matter: {', '.join(sorted(map(str, unexpected)))}")
    if "name" not in front or "description" not in front:
        raise ValueError("front matter needs 'name' and 'description'")
    name, desc = front["name"], front["description"]
    if not isinstance(name, str):
        raise ValueError("name must be a string")
    name = name.strip()
    if not _NAME.match(name) or name.startswith("-") or name.endswith("-") or "--" in name or len(name) > 64:
        raise ValueError(f"name {name!r} must be hyphen-case [a-z0-9-], no leading/trailing/double '-', <= 64")
    if name != folder:
        raise ValueError(f"name {name!r} does not match its folder {folder!r}")
    if not isinstance(desc, str) or not desc.strip():
        raise ValueError("description must be a non-empty string")
    desc = desc.strip()
    if "<" in desc or ">" in desc or len(desc) > 1024:
        raise ValueError("description must have no '<' or '>' and at most 1024 characters")
    comp = front.get("compatibility")
    if comp is not None and (not isinstance(comp, str) or len(comp) > 500):
        raise ValueError("compatibility must be a string of at most 500 characters")
    return name, desc


def _claw(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict):
        return {}
    for key in ("openclaw", "clawdbot", "clawdis"):
        if isinstance(meta.get(key), dict):
            return dict(meta[key])
    return {}


def _filters(
    desc: str, body: str, files: dict[str, bytes], claw: dict[str, Any], requires: dict[str, Any], bins: tuple[str, ...]
) -> str:
    """The paper's three criteria; the first that fails, with why ('' when all hold)."""
    if len(desc) < 40 or len(body) < 80:
        return "no practical value: the description or the instructions are too thin to build a task from"
    missing = sorted(set(bins) - SUBSTRATE_BINS)
    if missing:
        return f"runtime incompatible: requires binaries the substrate lacks: {', '.join(missing)}"
    any_bins = [str(b) for b in requires.get("anyBins") or ()]
    if any_bins and not set(any_bins) & SUBSTRATE_BINS:
        return f"runtime incompatible: needs one of {', '.join(any_bins)}"
    oses = [str(o) for o in claw.get("os") or ()]
    if oses and "linux" not in oses:
        return f"runtime incompatible: runs only on {', '.join(oses)}"
    secrets = [str(e) for e in requires.get("env") or ()] + (
        [str(claw["primaryEnv"])] if claw.get("primaryEnv") else []
    )
    secrets += [str(e.get("name")) for e in claw.get("envVars") or () if isinstance(e, dict) and e.get("required")]
    if secrets:
        return f"not deployable: needs secrets {', '.join(sorted(set(secrets)))}"
    text = body + "\n" + "\n".join(v.decode("utf-8", "replace") for k, v in files.items() if k.startswith("scripts/"))
    m = _NET.search(text)
    if m:
        return f"not deployable: needs network access ({m.group(0)[:60]})"
    return ""


_CUES: dict[str, tuple[str, ...]] = {
    "environment-understanding": (
        "find",
        "search",
        "inspect",
        "read",
        "evidence",
        "nested",
        "archive",
        "log",
        "locate",
    ),
    "planning": ("order", "step", "plan", "depend", "chain", "schedule", "join", "constraint"),
    "skill-use": ("script", "command", "`", "tool", "run", "regular expression", "csv", "json", "git"),
    "long-horizon-consistency": ("every", "consistent", "across", "keep", "track", "state", "many files", "each"),
    "error-recovery": ("fix", "repair", "fail", "error", "broken", "recover", "diagnose", "refuse", "missing"),
}


def derive_capabilities(text: str, files: dict[str, bytes] | None = None) -> dict[str, float]:
    """The skill's demand in each of the five dimensions (0..1): cue words in its text, plus bundled scripts for
    skill use. A floor of 0.1 keeps every dimension available to the synthesiser."""
    low = text.lower()
    raw = {d: float(sum(low.count(c) for c in _CUES[d])) for d in DIMENSIONS}
    if files and any(k.startswith("scripts/") for k in files):
        raw["skill-use"] += 3
    top = max(raw.values()) or 1.0
    return {d: round(max(0.1, raw[d] / top), 3) for d in DIMENSIONS}
