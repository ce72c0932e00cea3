"""SIGKILL the proxy mid-drain with answered calls in its outbox: the restarted proxy hands every answered call to
the log exactly once, parents before children (answered calls counted against events). And a full disk under the
outbox fails calls instead of answering them unrecorded."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ModelCallRecorded

from .._polling import await_until
from .test_recorder import Nats, assert_exactly_once_in_order

HERE = Path(__file__).parent
M = "opengyre-tiny"
LIMIT = 10  # the stream takes this many events, then refuses: the drain stops there, deterministically


class Proxy:
    def __init__(self, nats: Nats, cfg: LogConfig, engine: str, outbox: Path) -> None:
        self.args = [nats.url, cfg.stream, cfg.prefix, cfg.blob_bucket, engine, str(outbox)]
        self.port_file = outbox.parent / "proxy.url"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    async def start(self, *extra: str) -> None:
        self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_gateway_main.py"), *self.args, str(self.port_file), *extra], cwd=HERE
        )
        proc = self.proc
        await await_until(
            lambda: self.port_file.exists() or proc.poll() is not None, "the proxy process serves", polls=2400
        )
        assert proc.poll() is None, "the proxy process exited"
        self.url = self.port_file.read_text().strip()

    def sigkill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    async def metric(self, name: str) -> float:
        async with httpx.AsyncClient() as c:
            text = (await c.get(self.url + "/metrics")).text
        [value] = [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")]
        return float(value)

    async def restart_drained(self, log: EventLog, stream: StreamConfig) -> None:
        """Lift the stream's limit, start the (killed) proxy again and wait until its outbox is empty."""
        stream.max_msgs = -1
        await log.js.update_stream(stream)
        await self.start()

        async def drained() -> bool:
            return await self.metric("opengyre_proxy_outbox_events") == 0

        await await_until(drained, "the restarted proxy drained its outbox")


async def narrowed_stream(log: EventLog, cfg: LogConfig, limit: int) -> StreamConfig:
    """The log's stream made to take ``limit`` events and refuse the rest: a drain stops there, deterministically."""
    stream = StreamConfig(
        name=cfg.stream,
        subjects=[cfg.all_subjects],
        storage=StorageType.FILE,
        max_msgs=limit,
        discard=DiscardPolicy.NEW,
    )
    await log.js.update_stream(stream)
    return stream


@pytest.mark.slow
async def test_a_sigkilled_proxy_drains_its_outbox_after_restart_exactly_once(
    tmp_path: Path, engine_a: EngineServer
) -> None:
    nats = Nats(tmp_path / "nats")
    cfg = LogConfig(stream="CRASH", prefix="crash.ev", blob_bucket="CRASHB")
    log = await EventLog.connect(nats.url, cfg)  # made with no limit: narrowed below
    stream = await narrowed_stream(log, cfg, LIMIT)
    proxy = Proxy(nats, cfg, engine_a.url, tmp_path / "outbox.sqlite3")
    try:
        await proxy.start()
        # 4 conversations x 5 turns (each turn extends the last: parents and children); the log takes 10 events.
        answered: list[str] = []
        convs = {f"ex-{k}": [{"role": "user", "content": f"t{k}"}] for k in range(4)}
        for _ in range(5):

            async def turn(eid: str) -> None:
                client = openai.AsyncOpenAI(base_url=f"{proxy.url}/x/{eid}/v1", api_key="any", max_retries=0)
                r = await client.chat.completions.create(model=M, messages=convs[eid], max_tokens=3)  # type: ignore[arg-type]
                answered.append(r.id.removeprefix("chatcmpl-"))
                convs[eid] += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]

            await asyncio.gather(*(turn(eid) for eid in convs))

        async def stuck_at_limit() -> bool:
            info = await log.js.stream_info(cfg.stream)
            return info.state.messages == LIMIT and await proxy.metric("opengyre_proxy_record_send_failures_total") >= 2

        await await_until(stuck_at_limit, "the proxy drained up to the stream's limit")
        assert await proxy.metric("opengyre_proxy_outbox_events") == 20 - LIMIT
        proxy.sigkill()  # mid-drain: 10 answered calls are only in the outbox file

        await proxy.restart_drained(log, stream)
        events = [e async for _, e in log.events(ModelCallRecorded)]
        assert len(answered) == 20
        assert_exactly_once_in_order(events, answered)
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.sigkill()
        await log.close()
        nats.server.stop()


@pytest.mark.slow
async def test_a_call_whose_event_cannot_be_written_is_answered_with_an_error_and_not_recorded(
    tmp_path: Path, engine_a: EngineServer
) -> None:
    """The outbox's disk fills up (a file-size limit on the proxy process): calls fail with the dialect's error
    instead of being answered unrecorded; once space returns, calls are answered and recorded again."""
    nats = Nats(tmp_path / "nats")
    cfg = LogConfig(stream="FULL", prefix="full.ev", blob_bucket="FULLB")
    log = await EventLog.connect(nats.url, cfg)
    outbox = tmp_path / "outbox.sqlite3"
    proxy = Proxy(nats, cfg, engine_a.url, outbox)
    answered: list[str] = []

    def client(eid: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{proxy.url}/x/{eid}/v1", api_key="any", max_retries=0)

    async def call(eid: str, stream: bool = False) -> None:
        msgs = [{"role": "user", "content": f"hello {eid}"}]
        if not stream:
            r = await client(eid).chat.completions.create(model=M, messages=msgs, max_tokens=3)  # type: ignore[arg-type]
            answered.append(r.id.removeprefix("chatcmpl-"))
            return
        s = await client(eid).chat.completions.create(model=M, messages=msgs, max_tokens=3, stream=True)  # type: ignore[arg-type]
        cid = ""
        async for chunk in s:
            cid = chunk.id.removeprefix("chatcmpl-")
        answered.append(cid)

    try:
        await proxy.start()
        assert proxy.proc is not None
        for i in range(3):
            await call(f"ok-{i}")
        # No file of the proxy may grow past its present size (plus a page or two): the disk is full.
        used = max(p.stat().st_size for p in (outbox, Path(f"{outbox}-wal")) if p.exists())
        resource.prlimit(proxy.proc.pid, resource.RLIMIT_FSIZE, (used + 8192, resource.RLIM_INFINITY))
        refused = 0
        for i in range(40):
            try:
                await call(f"full-{i}", stream=i % 2 == 1)
            except openai.APIError as exc:
                assert "could not be recorded" in str(exc)
                refused += 1
                if refused == 4:
                    break
        assert refused == 4, "calls kept being answered with the outbox unable to take them"
        resource.prlimit(proxy.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        for i in range(3):
            await call(f"again-{i}")

        async def drained() -> bool:
            return await proxy.metric("opengyre_proxy_outbox_events") == 0

        await await_until(drained, "the proxy drained its outbox")
        assert await proxy.metric("opengyre_proxy_record_failed_total") == 4
        events = [e async for _, e in log.events(ModelCallRecorded)]
        assert_exactly_once_in_order(events, answered)
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.sigkill()
        await log.close()
        nats.server.stop()
