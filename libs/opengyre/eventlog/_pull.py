"""A lean pull consumer.

nats-py's ``fetch`` creates a task per message and tops out near 16k msgs/s on this machine; a plain
subscription callback with our own pull requests reads about 4x faster, which a projection rebuild needs.
Each pull request gets its own reply subject so a terminal status (404/408/409) ends exactly that request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import deque

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

__all__ = ["PullBatcher"]

_STATUS = "Status"


class PullBatcher:
    """Pull batches of messages from one JetStream consumer (durable or ephemeral)."""

    def __init__(
        self,
        nc: Client,
        stream: str,
        consumer: str,
        *,
        batch: int = 1024,
        expires: float = 2.0,
        in_flight: int = 2,
    ) -> None:
        self._nc = nc
        self._api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._batch = batch
        self._expires_ns = int(expires * 1e9)
        self._in_flight = in_flight
        self._prefix = ""
        self._sub: Subscription | None = None
        # reply token -> [messages still owed, deadline]; a request whose connection dropped never gets its
        # terminal status, so it also ends at its deadline.
        self._open: dict[str, list[float]] = {}
        self._expires = expires
        self._ids = itertools.count()
        self._buf: deque[Msg] = deque()
        self._ready = asyncio.Event()
        self.errors: list[str] = []

    async def start(self) -> None:
        self._prefix = f"{self._nc.new_inbox()}."
        self._sub = await self._nc.subscribe(
            f"{self._prefix}*", cb=self._on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1
        )

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        if headers and not msg.data and _STATUS in headers:
            token = msg.subject[len(self._prefix) :]
            status = headers[_STATUS]
            if status == "100":  # heartbeat / flow control
                return
            # 404 no messages, 408 expired, 409 consumer deleted / limits: the request is over.
            self._open.pop(token, None)
            if status not in ("404", "408"):
                self.errors.append(f"{status} {headers.get('Description', '')}".strip())
            self._ready.set()
            return
        # Data messages arrive on their own subject; the server fills pull requests in order.
        for first, entry in self._open.items():
            if entry[0] <= 1:
                del self._open[first]
            else:
                entry[0] -= 1
            break
        self._buf.append(msg)
        self._ready.set()

    async def _request(self) -> None:
        now = time.monotonic()
        for token in [t for t, (_, deadline) in self._open.items() if deadline < now]:
            del self._open[token]
        while len(self._open) < self._in_flight:
            token = str(next(self._ids))
            self._open[token] = [self._batch, now + self._expires + 1.0]
            body = json.dumps({"batch": self._batch, "expires": self._expires_ns}).encode()
            await self._nc.publish(self._api, body, reply=self._prefix + token)

    async def next_batch(self, *, max_msgs: int | None = None, timeout: float = 1.0) -> list[Msg]:
        """Whatever arrived (up to ``max_msgs``), waiting up to ``timeout`` for the first message."""
        await self._request()
        if not self._buf:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout)
            await self._request()
        limit = max_msgs or self._batch
        out: list[Msg] = []
        buf = self._buf
        while buf and len(out) < limit:
            out.append(buf.popleft())
        return out
