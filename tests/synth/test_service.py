"""The synth service over gRPC: ingest, build, list, validate, export, lineage; bad requests change nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from opengyre.config import Settings
from opengyre.eventlog import LogConfig
from opengyre.runtime import EmbeddedNats, grpc_channel, load_service, run_service
from opengyre.v1 import common_pb2, synth_pb2, synth_pb2_grpc
from tests._polling import await_until
from tests.apps.cli._cli import og

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


@pytest.fixture
async def served(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> AsyncIterator[tuple[synth_pb2_grpc.SynthServiceStub, str]]:
    """The service's stub and its address (host:port), for the CLI's verbs."""
    settings = Settings(data_dir=tmp_path, nats_url=nats_server.url, log=log_config)
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(load_service("synth"), settings, stop, port=0, ready=ready))
    port = await asyncio.wait_for(ready, 60)
    async with grpc_channel(f"127.0.0.1:{port}", settings.grpc_token()) as ch:
        yield synth_pb2_grpc.SynthServiceStub(ch), f"127.0.0.1:{port}"
    stop.set()
    await task


@pytest.fixture
def stub(served: tuple[synth_pb2_grpc.SynthServiceStub, str]) -> synth_pb2_grpc.SynthServiceStub:
    return served[0]


async def _folded(stub: synth_pb2_grpc.SynthServiceStub, n: int) -> None:
    async def done() -> bool:
        st = await stub.GetStatus(common_pb2.StatusRequest())
        tasks = next(p for p in st.projections if p.name == "tasks")
        return tasks.position >= n and tasks.pending == 0

    await await_until(done, f"{n} events are in the catalogue")


async def test_ingest_build_list_export_and_lineage(stub: synth_pb2_grpc.SynthServiceStub, tmp_path: Path) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.IngestSkills(synth_pb2.IngestSkillsRequest(source=str(tmp_path / "nowhere")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    got = await stub.IngestSkills(synth_pb2.IngestSkillsRequest(source=str(EXAMPLES)))
    assert len(got.skills) >= 8 and all(s.accepted for s in got.skills)
    csv = next(s.skill_id for s in got.skills if s.name == "csv-report")

    async def skills_folded() -> bool:
        st = await stub.GetStatus(common_pb2.StatusRequest())
        tasks = next(p for p in st.projections if p.name == "tasks")
        return tasks.position >= len(got.skills) and tasks.pending == 0

    await await_until(skills_folded, "the skills are in the catalogue")
    built = await stub.BuildTasks(synth_pb2.BuildTasksRequest(skill_ids=[csv], tasks_per_skill=1, seed=9))
    (t,) = built.tasks
    assert t.ok and {g.gate for g in t.gates} >= {"reference", "noop", "hang", "crash", "oom", "consistency"}

    async def listed() -> bool:
        tasks = (await stub.ListTasks(synth_pb2.ListTasksRequest())).tasks
        return [(x.task_id, x.validated) for x in tasks] == [(t.task_id, "true")]

    await await_until(listed, "the task is listed as validated")
    out = await stub.ExportTask(synth_pb2.ExportTaskRequest(task_id=t.task_id, dest=str(tmp_path / "exported")))
    assert (Path(out.path) / "tests" / "test.sh").is_file()
    lineage = await stub.GetLineage(synth_pb2.GetLineageRequest(task_id=t.task_id))
    assert [(v.version, v.parent_version, v.validated) for v in lineage.versions] == [(1, 0, "true")]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetLineage(synth_pb2.GetLineageRequest(task_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_cli_lists_exports_and_hardens_over_grpc_and_a_re_ingested_skill_drops_its_tasks(
    served: tuple[synth_pb2_grpc.SynthServiceStub, str], tmp_path: Path
) -> None:
    stub, addr = served
    skills = tmp_path / "skills"
    shutil.copytree(EXAMPLES / "csv-report", skills / "csv-report")
    got = await stub.IngestSkills(synth_pb2.IngestSkillsRequest(source=str(skills)))
    await _folded(stub, 1)
    for bad, why in (({"patterns": ["nope"]}, "unknown pattern 'nope'"), ({"knobs": {"rows": 40}}, "knobs need")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.BuildTasks(synth_pb2.BuildTasksRequest(**bad))  # type: ignore[arg-type]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in (err.value.details() or "")
    req = synth_pb2.BuildTasksRequest(tasks_per_skill=1, seed=3, patterns=["csv-aggregate"], knobs={"rows": 40})
    (t,) = (await stub.BuildTasks(req)).tasks
    assert t.ok, t
    await _folded(stub, 3)
    (v,) = (await stub.GetLineage(synth_pb2.GetLineageRequest(task_id=t.task_id))).versions
    assert json.loads(v.patterns_json) == [{"pattern_id": "csv-aggregate", "knobs": {"rows": 40.0}}]
    cli = ("--addr", addr, "--data-dir", str(tmp_path))
    res = await asyncio.to_thread(og, "synth", "list", *cli)
    assert res.returncode == 0 and t.task_id in res.stdout and "1 task(s)" in res.stdout, res.stdout + res.stderr
    dest = tmp_path / "out"
    res = await asyncio.to_thread(og, "synth", "export", t.task_id, str(dest), *cli)
    assert res.returncode == 0 and (dest / "tests" / "test.sh").is_file(), res.stdout + res.stderr
    res = await asyncio.to_thread(og, "synth", "export", "nope", str(tmp_path / "o2"), *cli)
    assert res.returncode == 2 and "NOT_FOUND: no task nope" in res.stdout, res.stdout
    res = await asyncio.to_thread(og, "synth", "harden", *cli)
    assert res.returncode == 0 and "0 task(s) hardened" in res.stdout, res.stdout + res.stderr
    res = await asyncio.to_thread(og, "synth", "list", "--addr", "127.0.0.1:9", "--data-dir", str(tmp_path))
    assert res.returncode == 2 and "no synth service at 127.0.0.1:9" in res.stdout, res.stdout

    # The skill changes and is re-ingested: its old version and the task built from it are no longer offered.
    md = skills / "csv-report" / "SKILL.md"
    md.write_text(md.read_text() + "\nCheck the totals twice before writing the report.\n")
    again = await stub.IngestSkills(synth_pb2.IngestSkillsRequest(source=str(skills)))
    assert again.skills[0].skill_id != got.skills[0].skill_id
    await _folded(stub, 4)
    assert [x.task_id for x in (await stub.ListTasks(synth_pb2.ListTasksRequest())).tasks] == []
    with pytest.raises(grpc.aio.AioRpcError) as err:  # the stale version is not built from any more
        await stub.BuildTasks(synth_pb2.BuildTasksRequest(skill_ids=[got.skills[0].skill_id]))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
