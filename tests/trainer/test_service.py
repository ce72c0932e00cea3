"""The TrainerService over gRPC, run as the stack runs it: precise status codes, scoring recorded in the log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from opengyre.config import Settings
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished
from opengyre.harness import HarnessSpec, HarnessTarget, run_harness
from opengyre.runtime import EmbeddedNats
from opengyre.sandbox import SandboxLimits
from opengyre.v1 import common_pb2, trainer_pb2

from .._polling import await_until
from ._events import group
from ._serving import serving_trainer


async def test_trainer_service_end_to_end(
    nats_server: EmbeddedNats, event_log: EventLog, log_config: LogConfig, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, nats_url=nats_server.url, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", log=log_config
    )
    await event_log.append_many(
        group("g", [("completed", 1.0, None), ("timed-out", 0.25, None), ("infra-failed", None, "oom")])
    )
    await event_log.append(ExecutionDispatched(execution_id="todo", task_id="t", group_id="h", group_size=1))
    async with serving_trainer(settings) as stub:
        st = await stub.GetStatus(common_pb2.StatusRequest())
        assert "score" in st.capabilities and [p.name for p in st.projections] == ["trainer"]

        ex = await stub.GetExecution(trainer_pb2.GetExecutionRequest(execution_id="g-e1"))
        assert (ex.status, ex.has_score, ex.score, ex.verdict) == ("timed-out", True, 0.25, "ok")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetExecution(trainer_pb2.GetExecutionRequest(execution_id="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        groups = await stub.ListReadyGroups(trainer_pb2.ListReadyGroupsRequest())
        [g] = groups.groups
        assert [(m.execution_id, m.decision) for m in g.members] == [
            ("g-e0", "train"),
            ("g-e1", "train"),
            ("g-e2", "masked"),
        ]

        prev = await stub.PreviewSamples(trainer_pb2.PreviewSamplesRequest(execution_id="g-e0", max_paths=1))
        assert len(prev.paths) == 1 and prev.paths[0].role == "main"
        full = await stub.PreviewSamples(trainer_pb2.PreviewSamplesRequest(execution_id="g-e0", max_paths=-1))
        assert full.target_tokens == full.generated_tokens  # every generated token once
        # 3 leaves and c1, which the summary forked inside: 4 path ends, every generated token on one
        assert len(full.paths) == full.tree_leaves == 4 and full.forward_tokens == full.all_paths_forward_tokens
        assert full.generated_tokens == 30
        assert prev.forward_tokens < full.forward_tokens and prev.target_tokens < full.target_tokens
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.PreviewSamples(trainer_pb2.PreviewSamplesRequest(execution_id="g-e0", max_paths=-3))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        task_dir = tmp_path / "task"
        (task_dir / "tests").mkdir(parents=True)
        (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\n")
        (tmp_path / "ws").mkdir()
        req = trainer_pb2.ScoreExecutionRequest(
            execution_id="todo", task_dir=str(task_dir), workspace=str(tmp_path / "ws"), timed_out=True
        )
        reply = await stub.ScoreExecution(req)
        assert (reply.status, reply.has_score, reply.score) == ("timed-out", True, 0.5) and reply.seq > 0

        async def scored() -> bool:
            e = await stub.GetExecution(trainer_pb2.GetExecutionRequest(execution_id="todo"))
            return e.status == "timed-out"

        await await_until(scored, "the execution was scored", polls=300, every=0.1)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ScoreExecution(req)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        bad = trainer_pb2.ScoreExecutionRequest(execution_id="todo", task_dir=str(tmp_path), workspace="/x")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ScoreExecution(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        steps = await stub.ListSteps(trainer_pb2.ListStepsRequest())
        assert list(steps.steps) == []


async def test_service_trains_online_with_a_trainer_toml(
    nats_server: EmbeddedNats, event_log: EventLog, log_config: LogConfig, tmp_path: Path
) -> None:
    (tmp_path / "trainer.toml").write_text(
        'run_id = "svc"\nmodel = "tiny"\nalgorithm = "grpo"\ngroup_size = 2\nlr = 1e-3\ncheckpoint_dir = "ckpt"\n'
    )
    settings = Settings(
        data_dir=tmp_path, nats_url=nats_server.url, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", log=log_config
    )
    await event_log.append_many(group("g", [("completed", 1.0, None), ("completed", 0.0, None)]))
    async with serving_trainer(settings) as stub:

        async def published() -> bool:
            w = await stub.ListWeights(trainer_pb2.ListWeightsRequest(run_id="svc"))
            return len(w.versions) == 1

        await await_until(published, "weights were published", polls=1200, every=0.1)
        [v] = (await stub.ListWeights(trainer_pb2.ListWeightsRequest(run_id="svc"))).versions
        assert v.weight_version == "svc-s1" and Path(v.uri).is_relative_to(tmp_path / "ckpt")
        [s] = (await stub.ListSteps(trainer_pb2.ListStepsRequest(run_id="svc"))).steps
        assert (s.n_trained, s.n_dropped, s.has_reward_mean, s.reward_mean) == (2, 0, True, 0.5)
        ex = await stub.GetExecution(trainer_pb2.GetExecutionRequest(execution_id="g-e0"))
        assert ex.consumed and ex.consumed_step == 1 and ex.consumed_as == "train"


async def test_an_executions_finish_says_which_sandbox_ran_its_harness(
    nats_server: EmbeddedNats, event_log: EventLog, log_config: LogConfig, tmp_path: Path
) -> None:
    """The isolation a real harness ran under (``HarnessOutcome.isolation``, what the rollout path sends) is in
    its ``execution-finished``: ``none`` chosen explicitly says so, the default says ``namespace``."""
    settings = Settings(
        data_dir=tmp_path, nats_url=nats_server.url, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", log=log_config
    )
    task_dir = tmp_path / "task"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    spec = HarnessSpec("h", ("bash", "-c", "echo done > out"))
    ran = {}
    for eid, backend in (("plain", "none"), ("isolated", None)):
        ws = tmp_path / eid
        ws.mkdir()
        target = HarnessTarget("http://127.0.0.1:59999/v1", "key", "tiny", ws, "do it")
        outcome = await asyncio.to_thread(run_harness, spec, target, SandboxLimits(timeout_s=60), backend=backend)
        assert outcome.exit_code == 0, outcome.stderr
        ran[eid] = (ws, outcome.isolation)
        await event_log.append(ExecutionDispatched(execution_id=eid, task_id="t", group_id=eid, group_size=1))
    assert {eid: isolation for eid, (_, isolation) in ran.items()} == {"plain": "none", "isolated": "namespace"}
    async with serving_trainer(settings) as stub:
        bad = trainer_pb2.ScoreExecutionRequest(
            execution_id="plain", task_dir=str(task_dir), workspace=str(ran["plain"][0]), sandbox="no isolation!"
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ScoreExecution(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sandbox" in str(err.value.details())
        for eid, (ws, isolation) in ran.items():
            req = trainer_pb2.ScoreExecutionRequest(
                execution_id=eid, task_dir=str(task_dir), workspace=str(ws), has_exit_code=True, sandbox=isolation
            )
            reply = await stub.ScoreExecution(req)
            assert (reply.status, reply.score) == ("completed", 1.0), reply
    finished = {e.execution_id: e.sandbox async for _, e in event_log.events(ExecutionFinished)}
    assert finished == {"plain": "none", "isolated": "namespace"}
