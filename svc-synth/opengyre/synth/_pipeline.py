"""Skill2Env end to end over a task store: ingest skills, synthesize and validate tasks, harden flagged versions.

Each step returns the events to append (svc-synth is their only producer); hardening's events have ids derived
from the task version, so a step repeated before its events were folded appends nothing twice (the log
de-duplicates by event id).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import msgspec
from sqlalchemy import Engine, select

from opengyre.events import Event, PatternUse, SkillIngested, TaskHardened, TaskSynthesized, TaskTooEasy, TaskValidated

from ._blueprint import Blueprint, load_blueprint
from ._build import build_task, skill_digests, task_skill_files, write_task
from ._diagnose_llm import diagnose_llm
from ._gates import GateLimits, Verdict, validate_task
from ._hardening import ExecutionRow, HardeningProjection, WindowRow, diagnose, propose
from ._llm import LlmConfig, draft_blueprint_llm
from ._skills import IngestReport, Skill, ingest, keep_skill, kept_skill, read_skill_files
from ._synth import draft_blueprint

__all__ = ["Synthesizer", "TaskBuild"]

_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_E = ExecutionRow.__table__
_W = WindowRow.__table__


def _eid(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:32]


def _uses(bp: Blueprint) -> list[PatternUse]:
    return [PatternUse(pattern_id=c.pattern_id, knobs={k: float(v) for k, v in c.knobs.items()}) for c in bp.challenges]


@dataclass(frozen=True)
class TaskBuild:
    blueprint: Blueprint
    task_dir: Path
    verdicts: list[Verdict]
    events: list[Event]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def validated_event(bp: Blueprint, verdicts: Sequence[Verdict]) -> TaskValidated:
    return _validated(bp.task_id, bp.version, verdicts)


def _validated(task_id: str, version: int, verdicts: Sequence[Verdict]) -> TaskValidated:
    failed = [v for v in verdicts if not v.ok]
    return TaskValidated(
        task_id=task_id,
        task_version=version,
        ok=not failed,
        checks={v.gate: v.ok for v in verdicts},
        reasons={v.gate: v.reason for v in verdicts},
        reason="; ".join(f"{v.gate}: {v.reason}" for v in failed) or "every gate passed",
    )


class Synthesizer:
    def __init__(
        self, store: Path, gates: GateLimits | None = None, *, workers: int = 4, llm: LlmConfig | None = None
    ) -> None:
        self.store = Path(store)
        self.llm = llm  # a synthesis model drafts the blueprints; None: the procedural mode
        self.gates = gates or GateLimits()
        self.workers = workers
        self._seed_key: bytes | None = None

    def task_seed(self, skill_id: str, seed: int) -> int:
        """The blueprint's seed for the caller's ``seed``: keyed with the store's secret (``<store>/seed.key``, made
        once, never shown to a sandbox). The generators are no secret (the namespace sandbox hides their code, but an
        agent may know it), and the caller's seeds are small numbers: from them alone an agent regenerated a task's
        reference solution in seconds. Keyed, the same store still builds the same task for the same seed."""
        mac = hmac.new(self._key(), f"{skill_id}/{seed}".encode(), hashlib.sha256).digest()
        return int.from_bytes(mac[:8], "big") >> 1

    def _key(self) -> bytes:
        if self._seed_key is not None:
            return self._seed_key
        path = self.store / "seed.key"
        self.store.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            # Written whole under a temporary name, then linked into place: a concurrent build (or another process
            # on the same store) reads either no key or the whole one, and the first link wins.
            tmp = path.with_name(f"seed.key.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_bytes(32).hex() + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        key = bytes.fromhex(path.read_text().strip())
        if len(key) != 32:
            raise ValueError(f"{path} does not hold a 32-byte key in hex")
        self._seed_key = key
        return key

    def kept(self, digest: str, name: str) -> Skill | None:
        """The skill this store kept when it ingested ``digest`` (None: it ingested no such skill)."""
        return kept_skill(self.store / "skill-files", digest, name)

    def task_dir(self, task_id: str, version: int) -> Path:
        return self.store / "tasks" / task_id / f"v{version}"

    def versions(self, task_id: str) -> list[Blueprint]:
        """Every version of a task this store built, oldest first, read from the blueprints it wrote: the lineage
        without the catalogue (no stack needed). An id that is not a task id finds nothing."""
        if not _TASK_ID.match(task_id):
            return []
        found = []
        for d in (self.store / "tasks" / task_id).glob("v*"):
            src = d / "tests" / "blueprint.json"
            if d.name[1:].isdigit() and src.is_file():
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):  # a tampered one is skipped
                    found.append(load_blueprint(src.read_bytes()))
        return sorted(found, key=lambda bp: bp.version)

    def ingest(self, source: Path) -> tuple[IngestReport, list[SkillIngested]]:
        """Skills from ``source``; each accepted one is also kept in the store by its digest (``kept``), so a
        service that knows a skill from the catalogue alone builds its tasks with its files."""
        report = ingest(source, self.store / "skills")
        for s in report.accepted:
            keep_skill(s, self.store / "skill-files")
        events = [
            SkillIngested(
                skill_id=s.skill_id,
                name=s.name,
                description=s.description,
                source=str(source),
                digest=s.digest,
                domain=s.domain,
                capabilities=s.capabilities,
                metadata={"license": s.license, "requires_bins": " ".join(s.requires_bins)},
            )
            for s in report.accepted
        ]
        for r in report.rejected:
            slug = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in r.name)[:80] or "skill"
            events.append(
                SkillIngested(
                    skill_id=f"{slug}-{(r.digest or _eid(r.source))[:10]}",
                    name=r.name[:64],
                    description="",
                    source=r.source,
                    digest=r.digest,
                    accepted=False,
                    reason=r.reason,
                )
            )
        return report, events

    def _materialize(self, bp: Blueprint, skill: Mapping[str, bytes] | None) -> Path:
        built = build_task(bp, skill)
        out = self.task_dir(bp.task_id, bp.version)
        if out.exists():  # a step repeated: the same blueprint builds the same bytes, anything else is refused
            have = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
            if have != built.files:
                raise FileExistsError(f"{out} holds another build of {bp.task_id} v{bp.version}")
            return out
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_task(built, tmp)
        tmp.rename(out)
        return out

    def draft(
        self,
        skill: Skill,
        seed: int,
        *,
        n_challenges: int = 2,
        level: int = 0,
        patterns: Sequence[str] | None = None,
        knobs: Mapping[str, int] | None = None,
    ) -> tuple[Blueprint, dict[str, bytes]]:
        """The blueprint ``synthesize`` builds for ``skill`` at ``seed`` and the skill's files it ships, neither built
        nor validated (an operator's or a test's copy of the very task a run builds). ``patterns`` and ``knobs`` fix
        the choice (see ``draft_blueprint``; the procedural mode then, even with a synthesis model configured)."""
        seed = self.task_seed(skill.skill_id, seed)
        files = read_skill_files(skill)  # the skill travels with the task
        if self.llm is not None and not patterns and not knobs:
            bp = draft_blueprint_llm(
                self.llm,
                skill_id=skill.skill_id,
                skill_name=skill.name,
                description=skill.description,
                body=skill.body,
                capabilities=skill.capabilities,
                seed=seed,
                n_challenges=n_challenges,
                domain=skill.domain,
            )
        else:
            bp = draft_blueprint(
                skill_id=skill.skill_id,
                skill_name=skill.name,
                capabilities=skill.capabilities,
                seed=seed,
                n_challenges=n_challenges,
                level=level,
                patterns=patterns,
                knobs=knobs,
                domain=skill.domain,
            )
        return msgspec.structs.replace(bp, skill_files=skill_digests(files)), files

    def synthesize(
        self,
        skill: Skill,
        seed: int,
        *,
        n_challenges: int = 2,
        level: int = 0,
        patterns: Sequence[str] | None = None,
        knobs: Mapping[str, int] | None = None,
    ) -> TaskBuild:
        """One task built and validated: ``draft``'s blueprint, with the skill's files."""
        bp, files = self.draft(skill, seed, n_challenges=n_challenges, level=level, patterns=patterns, knobs=knobs)
        return self.build_and_validate(bp, files)

    def revalidate(self, task_id: str, version: int, task_dir: Path) -> tuple[list[Verdict], TaskValidated]:
        """Every gate on the directory as it is now (not rebuilt: a blueprint tampered with there fails them)."""
        verdicts = validate_task(task_dir, self.gates)
        return verdicts, _validated(task_id, version, verdicts)

    def build_and_validate(self, bp: Blueprint, skill: Mapping[str, bytes] | None = None) -> TaskBuild:
        """``skill``: the skill's files, where the blueprint ships them (``Blueprint.skill_files``)."""
        out = self._materialize(bp, skill)
        verdicts = validate_task(out, self.gates)
        synthesized = TaskSynthesized(
            task_id=bp.task_id,
            skill_id=bp.skill_id,
            task_version=bp.version,
            patterns=_uses(bp),
            blueprint=msgspec.to_builtins(bp),
            task_dir=str(out),
            capabilities=bp.capabilities,
        )
        return TaskBuild(bp, out, verdicts, [synthesized, validated_event(bp, verdicts)])

    def synthesize_many(
        self,
        jobs: Sequence[tuple[Skill, int]],
        *,
        n_challenges: int = 2,
        level: int = 0,
        patterns: Sequence[str] | None = None,
        knobs: Mapping[str, int] | None = None,
        progress: object = None,
    ) -> list[TaskBuild]:
        """Tasks built and validated concurrently (the sandboxes are processes; threads wait on them)."""
        with ThreadPoolExecutor(self.workers) as pool:
            futs = [
                pool.submit(
                    self.synthesize, s, seed, n_challenges=n_challenges, level=level, patterns=patterns, knobs=knobs
                )
                for s, seed in jobs
            ]
            out = []
            for f in futs:
                out.append(f.result())
                if callable(progress):
                    progress()
            return out

    # --- hardening -------------------------------------------------------------------------------------

    def pending(self, engine: Engine) -> list[tuple[str, int]]:
        with engine.connect() as conn:
            rows = conn.execute(
                select(_W.c.task_id, _W.c.task_version)
                .where(_W.c.flagged_seq.is_not(None), _W.c.hardened.is_(False))
                .order_by(_W.c.flagged_seq)
            )
            # Only versions this store built can be diagnosed and rebuilt (a demo's or an imported task's cannot).
            return [
                (r.task_id, r.task_version)
                for r in rows
                if (self.task_dir(r.task_id, r.task_version) / "tests" / "blueprint.json").is_file()
            ]

    def harden(self, engine: Engine, task_id: str, version: int, projection: HardeningProjection) -> list[Event]:
        """task-too-easy for the flagged version, then the diagnosed, raised, validated next version."""
        with engine.connect() as conn:
            w = conn.execute(select(_W).where(_W.c.task_id == task_id, _W.c.task_version == version)).one()
            trajs = [
                json.loads(r.actions)
                for r in conn.execute(
                    select(_E.c.actions)
                    .where(_E.c.task_id == task_id, _E.c.task_version == version, _E.c.score.is_not(None))
                    .order_by(_E.c.updated_seq)
                )
            ][-projection.window :]
        rewards = json.loads(w.rewards)
        events: list[Event] = []
        if w.too_easy_seq is None:
            events.append(
                TaskTooEasy(
                    event_id=_eid("too-easy", task_id, version),
                    task_id=task_id,
                    task_version=version,
                    mean_reward=float(w.mean),
                    n_samples=len(rewards),
                    threshold=projection.threshold,
                )
            )
        src = self.task_dir(task_id, version) / "tests" / "blueprint.json"
        bp = load_blueprint(src.read_bytes())
        bp.validate()  # before its names choose what is read from the store (a tampered one is refused here)
        # The next version ships the same skill: taken from the flagged version's directory (checked against the
        # digests its blueprint names when it is built).
        skill = task_skill_files(self.task_dir(task_id, version), bp) if bp.skill_files else None
        d = diagnose(bp, trajs)
        earlier = self._built_next(task_id, version)
        if earlier is not None:
            # An earlier attempt of this step built the next version and stopped before its events were in the log:
            # that version again. Another diagnosis (new trajectories, a model) could propose another, which the
            # directory it would go to refuses; the events' ids derive from the version, so either way one lands.
            build = self.build_and_validate(earlier, skill)
            if build.ok:
                why = "the version an earlier attempt of this step built (it stopped before its events were logged)"
                return [*events, *self._hardened(task_id, version, earlier, build, why, _changed(bp, earlier) or d.cid)]
            shutil.rmtree(build.task_dir, ignore_errors=True)  # not a build of ours any more: made again below
        if self.llm is not None:  # the diagnosis agent; the heuristic's answer stands where the model gives none
            d = diagnose_llm(self.llm, bp, trajs, d)
        for _ in range(3):  # a proposal that fails the gates is raised once more
            nxt, reason = propose(bp, d)
            build = self.build_and_validate(nxt, skill)
            if build.ok:
                return [*events, *self._hardened(task_id, version, nxt, build, reason, d.cid)]
            bp = msgspec.structs.replace(nxt, version=version)  # raise further from the failed proposal
            shutil.rmtree(build.task_dir, ignore_errors=True)
        return events

    def _built_next(self, task_id: str, version: int) -> Blueprint | None:
        """The next version's blueprint where this store already built it, else None."""
        path = self.task_dir(task_id, version + 1) / "tests" / "blueprint.json"
        if not path.is_file():
            return None
        nxt = load_blueprint(path.read_bytes())
        nxt.validate()
        return nxt if (nxt.task_id, nxt.version, nxt.parent_version) == (task_id, version + 1, version) else None

    @staticmethod
    def _hardened(
        task_id: str, version: int, nxt: Blueprint, build: TaskBuild, reason: str, bypassed: str
    ) -> list[Event]:
        hardened = TaskHardened(
            event_id=_eid("hardened", task_id, version),
            task_id=task_id,
            from_version=version,
            to_version=nxt.version,
            patterns=_uses(nxt),
            reason=reason,
            bypassed=bypassed,
            blueprint=msgspec.to_builtins(nxt),
            task_dir=str(build.task_dir),
        )
        validated = msgspec.structs.replace(build.events[1], event_id=_eid("validated", task_id, nxt.version))
        return [hardened, validated]


def _changed(old: Blueprint, new: Blueprint) -> str:
    """The challenge a proposal changed (its knobs raised, or added), "" when none can be told."""
    before = {c.cid: c.knobs for c in old.challenges}
    for c in new.challenges:
        if before.get(c.cid) != c.knobs:
            return c.cid
    return ""
