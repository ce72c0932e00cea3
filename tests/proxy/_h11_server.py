"""A small real HTTP/1.1 server (h11 over asyncio streams) whose connection handling a test can steer.

It answers every request with a short JSON body and keeps connections alive. A test can make it behave like a
server whose keep-alive ran out just as a request arrived (``drop_reused``: a connection that already served a
request is closed when the next one comes, unanswered), or like a server that hangs (``silent``, ``stall_body``).
"""

from __future__ import annotations

import asyncio
import contextlib

import h11

__all__ = ["H11Server"]

BODY = b'{"ok": true}'


class H11Server:
    def __init__(self) -> None:
        self.connections = 0  # connections accepted so far
        self.open = 0  # connections open now
        self.requests = 0  # complete requests received
        self.drop_reused = False
        self.silent = False  # never answer
        self.stall_body = False  # send the head and part of the body, then nothing
        self._server: asyncio.Server | None = None

    async def start(self) -> H11Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        conn = h11.Connection(h11.SERVER)
        served = 0
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                    continue
                if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
                if not isinstance(event, h11.EndOfMessage):
                    continue
                self.requests += 1
                if self.drop_reused and served:
                    return  # closed unanswered, as a server whose keep-alive ran out
                if self.silent:
                    await reader.read()  # until the client gives up
                    return
                length = len(BODY) * (10 if self.stall_body else 1)
                head = h11.Response(
                    status_code=200, headers=[("content-type", "application/json"), ("content-length", str(length))]
                )
                writer.write(conn.send(head))
                writer.write(conn.send(h11.Data(data=BODY)))
                if self.stall_body:
                    await writer.drain()
                    await reader.read()
                    return
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                served += 1
                conn.start_next_cycle()
        except (ConnectionError, h11.RemoteProtocolError):
            return
        finally:
            self.open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
