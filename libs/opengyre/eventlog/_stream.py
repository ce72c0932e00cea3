"""The event stream's administration: create it (its one owner also configures it), and its position and size."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StoreCompression, StreamConfig, StreamInfo
from nats.js.errors import NotFoundError

from ._config import LogConfig
from ._health import StreamUsage
from ._retrying import waiting_out_election

__all__ = ["StreamAdmin", "compression_of"]


def compression_of(config: StreamConfig) -> StoreCompression:
    """A stream's compression as the server reports it (absent: none, as a stream made before 2.10 has)."""
    return StoreCompression(config.compression or StoreCompression.NONE)


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
                    compression=StoreCompression(cfg.compression),
                )
            )
            return
        have = info.config
        want = (cfg.max_bytes, DiscardPolicy.NEW, cfg.replicas, StoreCompression(cfg.compression))
        if configure and (have.max_bytes, have.discard, have.num_replicas, compression_of(have)) != want:
            # A clustered server moves the stream to the new replica count in place; a new compression applies
            # to blocks sealed from then on.
            have.max_bytes, have.discard, have.num_replicas, have.compression = want
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
            self._config.stream,
            int(info.state.bytes),
            int(info.state.messages),
            int(info.config.max_bytes or -1),
            compression_of(info.config).value,
        )

    async def first_seq(self) -> int:
        info = await self._info()
        return int(info.state.first_seq)
