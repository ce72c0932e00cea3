"""Which stream a projection folded: its tracking positions count in that stream, and only in it.

A stream deleted and re-created under the same name starts again at sequence 1; a JetStream store put back to
an earlier copy (a restore, a second server on the same store) ends before positions already applied, and once
appended to again holds other events at those sequences. Either way a projection that went on from its
position would skip events without a word. The runner records the stream's name and creation time, and the
sequence and event id of the last event it tracked, and refuses, loudly, to fold a stream that does not match
until the projection is rebuilt.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nats.js.api import Header
from nats.js.errors import NotFoundError

from ..eventlog import EventLog
from ._apply import FoldTransaction, StreamRecord

__all__ = ["StreamMismatch", "StreamNow", "check_stream", "problem"]


class StreamMismatch(Exception):
    """The log's stream is not the one the projection's tracking rows count in: rebuild the projection."""


@dataclass(frozen=True)
class StreamNow:
    name: str
    created: str  # "" when the stream does not exist
    last_seq: int


async def _stream_now(log: EventLog) -> StreamNow:
    """The stream as the server has it now (a server that does not answer raises: transient)."""
    name = log.config.stream
    try:
        info = await log.js.stream_info(name)
    except NotFoundError:
        return StreamNow(name, "", 0)
    created = info.created.isoformat() if info.created is not None else ""
    return StreamNow(name, created, int(info.state.last_seq))


async def _event_id_at(log: EventLog, seq: int) -> str | None:
    """The event id of the message at ``seq``; None when there is none (removed by a limit, a purge)."""
    try:
        raw = await log.js.get_msg(log.config.stream, seq)
    except NotFoundError:
        return None
    return str((raw.headers or {}).get(Header.MSG_ID, ""))


def _rebuild(projection: str) -> str:
    return f"rebuild it from this stream: `opengyre down && opengyre projections rebuild {projection}`"


def problem(
    projection: str, recorded: StreamRecord | None, position: int, now: StreamNow, id_at_last: str | None
) -> str | None:
    """Why the projection must not fold the stream ``now``; None when it may. ``id_at_last``: the event id
    the stream holds now at ``recorded.last_seq`` (None: no message there)."""
    if not now.created:
        return f"projection {projection}: stream {now.name} does not exist (deleted?); its events are gone"
    if recorded is not None and (recorded.stream, recorded.created) != (now.name, now.created):
        return (
            f"projection {projection} folded stream {recorded.stream} created {recorded.created}, but the log's "
            f"stream {now.name} was created {now.created} (deleted and re-created?): its positions mean nothing "
            "there; " + _rebuild(projection)
        )
    if position > now.last_seq:
        return (
            f"projection {projection} applied events up to seq {position}, but stream {now.name} ends at seq "
            f"{now.last_seq}: the log lost events it had acknowledged (a restored or rolled-back store?); "
            + _rebuild(projection)
        )
    if recorded is not None and recorded.last_seq and id_at_last is not None and id_at_last != recorded.last_event_id:
        return (
            f"projection {projection} applied event {recorded.last_event_id or '(no id)'} at seq {recorded.last_seq}, "
            f"but stream {now.name} holds event {id_at_last or '(no id)'} there: the log was rolled back and "
            "appended to again (a restored store?); " + _rebuild(projection)
        )
    return None


async def check_stream(fold: FoldTransaction, log: EventLog, *, bind: bool = True) -> tuple[StreamNow, str | None]:
    """The stream now and why it must not be folded (None: it may). With ``bind``, a projection that has not
    recorded its stream yet (a fresh one, or tracking rows from before streams were recorded) takes this one."""
    # The position first, the stream after: a runner folding meanwhile only moves the position up to what the
    # stream already held, so "position past the stream's end" never comes from reading the two out of order.
    recorded = await asyncio.to_thread(fold.tracked_stream)
    position = await asyncio.to_thread(fold.position)
    now = await _stream_now(log)
    check_seq = recorded.last_seq if recorded is not None else position
    id_at = await _event_id_at(log, check_seq) if now.created and 0 < check_seq <= now.last_seq else None
    why = problem(fold.projection.name, recorded, position, now, id_at)
    if why is None and recorded is None and bind:
        await asyncio.to_thread(fold.bind_stream, StreamRecord(now.name, now.created, check_seq, id_at or ""))
        recorded = await asyncio.to_thread(fold.tracked_stream)  # a concurrent runner may have bound it first
        why = problem(fold.projection.name, recorded, position, now, id_at)
    return now, why
