"""Pipelined JetStream publishes with a reply inbox of our own.

nats-py's ``publish_async`` leaves the future pending forever when the server answers with an API error
(``APIError.from_error`` raises inside its reply callback), so we keep our own inbox and futures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

__all__ = ["AckError", "AckPipeline", "PubAck"]


class PubAck:
    __slots__ = ("duplicate", "seq")

    def __init__(self, seq: int, duplicate: bool) -> None:
        self.seq = seq
        self.duplicate = duplicate


class AckError(Exception):
    """The server refused a publish; ``err_code`` is JetStream's numeric error code."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"code={code} err_code={err_code} {description}")
        self.code = code
        self.err_code = err_code
        self.description = description


class AckPipeline:
    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Subscription | None = None
        self._futures: dict[str, asyncio.Future[PubAck]] = {}
        self._ids = itertools.count()

    async def start(self) -> None:
        self._prefix = f"{self._nc.new_inbox()}."
        self._sub = await self._nc.subscribe(f"{self._prefix}*", cb=self._on_reply)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        for fut in self._futures.values():
            if not fut.done():
                fut.cancel()
        self._futures.clear()

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[PubAck]:
        token = str(next(self._ids))
        fut: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
        except BaseException:
            self._futures.pop(token, None)
            raise
        return fut

    async def _on_reply(self, msg: Msg) -> None:
        fut = self._futures.pop(msg.subject[len(self._prefix) :], None)
        if fut is None or fut.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            fut.set_exception(AckError(503, 0, "no stream answers on this subject"))
            return
        try:
            resp: dict[str, Any] = json.loads(msg.data)
        except ValueError as exc:
            fut.set_exception(AckError(500, 0, f"undecodable publish ack: {exc}"))
            return
        err = resp.get("error")
        if err:
            fut.set_exception(
                AckError(int(err.get("code", 0)), int(err.get("err_code", 0)), str(err.get("description", "")))
            )
            return
        fut.set_result(PubAck(int(resp["seq"]), bool(resp.get("duplicate", False))))
