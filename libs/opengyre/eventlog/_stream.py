"""The event stream's administration: create it (its one owner also configures it), and its position and size."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig, StreamInfo
from nats.js.errors import NotFoundError

from ._config import LogConfig
from ._health import StreamUsage
from ._retrying import waiting_out_election

__all__ = ["StreamAdmin"]


class StreamAdmin:
    def __init__(self, js: JetStreamContext, config: LogConfig) -> None:
        self._js = js
        self._config = config

    async def ensure(self, *, configure: bool = False) -> None:
        """Create the event stream if it is missing; with ``configure`` (the stream's owner only: ``opengyre
        up``) also bring an existing one's byte limit and replicas to the configured ones.

        Discard policy "new": when ``max_bytes`` is reached appends are refused, never old events dropped (a
        projection that has not folded them yet would lose them)."""
        cfg = self._config
        try:
            info = await self._js.stream_info(cfg.stream)
        except NotFoundError:
            await self._js.add_stream(
                StreamConfig(
                    name=cfg.stream,
                    subjects=[cfg.all_subjects],
                    storage=StorageType.FILE,
                    duplicate_window=cfg.duplicate_window_s,
                    num_replicas=cfg.replicas,
                    max_msg_size=-1,
                    max_bytes=cfg.max_bytes,
                    discard=DiscardPolicy.NEW,
                )
            )
            return
        have = info.config
        want = (cfg.max_bytes, DiscardPolicy.NEW, cfg.replicas)
        if configure and (have.max_bytes, have.discard, have.num_replicas) != want:
            # A clustered server moves the stream to the new replica count in place.
            have.max_bytes, have.discard, have.num_replicas = cfg.max_bytes, DiscardPolicy.NEW, cfg.replicas
            await self._js.update_stream(have)

    async def _info(self) -> StreamInfo:
        """The stream's info, waiting out a leader election (10008) on a cluster."""
        return await waiting_out_election(
            f"stream info of {self._config.stream}", self._config, lambda: self._js.stream_info(self._config.stream)
        )

    async def last_seq(self) -> int:
        info = await self._info()
        return int(info.state.last_seq)

    async def usage(self) -> StreamUsage:
        """The event stream's bytes and messages against its byte limit (``StreamUsage.full``: appends refused)."""
        info = await self._info()
        return StreamUsage(
            self._config.stream, int(info.state.bytes), int(info.state.messages), int(info.config.max_bytes or -1)
        )

    async def first_seq(self) -> int:
        info = await self._info()
        return int(info.state.first_seq)
