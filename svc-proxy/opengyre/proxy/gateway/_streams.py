"""A call's streamed body: the dialect's stream of frames ended by its error event when the generation or its
recording failed, ``n`` samples' streams merged into one (as objects: nothing is re-parsed), and the response
that frames it into SSE bytes, once, and gives engine slots back if the client leaves before the body starts.
Errors the recorder raises become the caller's (403, sealed) or ours (500)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from opengyre.wire import DONE, ApiError, Frame, Outcome, framed

from ..dialects._dialects import Dialect
from ..engines._dispatch import Dispatch
from ..recording._recorder import ExecutionSealed, RecordFailed

__all__ = ["CallStream", "guard", "merge_choices", "outcome_of", "record_error", "stream_errors"]


class CallStream(StreamingResponse):
    """A streamed call, framed into SSE here (the one place the gateway writes it), that gives its engine slots
    back even if the client leaves before the body starts."""

    def __init__(self, content: AsyncIterator[Frame], *dispatches: Dispatch, **kw: Any) -> None:
        super().__init__(framed(content), **kw)
        self._dispatches = dispatches

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for d in self._dispatches:
                await d.release_if_unstarted()


def outcome_of(d: Dispatch) -> Callable[[], Outcome]:
    return lambda: d.outcome


async def merge_choices(streams: list[AsyncIterator[Frame]], include_usage: bool) -> AsyncIterator[Frame]:
    """n OpenAI streams as one: sample i's chunks carry choice index i, as they come; one usage chunk
    (completion tokens summed) and one ``[DONE]`` at the end; the first error frame ends the whole stream."""
    queue: asyncio.Queue[tuple[int, Frame | None]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[Frame]) -> None:
        try:
            async for frame in s:
                await queue.put((i, frame))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    usage: dict[str, Any] | None = None
    head: dict[str, Any] | None = None
    running = len(tasks)
    try:
        while running:
            i, frame = await queue.get()
            if frame is None:
                running -= 1
                continue
            obj = frame.data
            if obj is None:  # a sample's [DONE]: the merged stream has one, at the end
                continue
            if "error" in obj:
                yield frame
                yield DONE
                return
            if not obj.get("choices"):  # a usage chunk: summed into the one at the end
                u = obj.get("usage") or {}
                if usage is None:
                    usage, head = dict(u), {k: v for k, v in obj.items() if k not in ("choices", "usage")}
                else:
                    usage["completion_tokens"] += u.get("completion_tokens", 0)
                    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                continue
            for c in obj["choices"]:
                c["index"] = i  # the chunk is this sample's own object (made per chunk by the dialect)
            yield frame
        if include_usage and usage is not None and head is not None:
            yield Frame({**head, "choices": [], "usage": usage})
        yield DONE
    finally:
        for t in tasks:
            t.cancel()


async def guard(
    source: AsyncIterator[tuple[list[int], list[float]]], outcome: Outcome
) -> AsyncIterator[tuple[list[int], list[float]]]:
    """Turn an engine refusal in mid-stream into an aborted outcome (the stream then ends with an error)."""
    try:
        async for item in source:
            yield item
    except ApiError as err:
        outcome.finish = {"type": "abort", "message": err.message, "status_code": err.status}


def _not_recorded(exc: RecordFailed) -> str:
    return f"the call could not be recorded, so it is not answered (nothing was recorded): {exc}"


def record_error(exc: RecordFailed) -> ApiError:
    """A sealed execution is the caller's error (403: its rollout ended); any other failure to record is ours."""
    if isinstance(exc, ExecutionSealed):
        return ApiError(403, "permission", str(exc), code="execution_sealed")
    return ApiError(500, "api_error", _not_recorded(exc))


async def stream_errors(
    stream: AsyncIterator[Frame], outcome: Outcome, dialect: Dialect, failed_with: Callable[[int], None]
) -> AsyncIterator[Frame]:
    """Pass the dialect's stream through, but end it with the dialect's error event if generation aborted.

    The dialect streams stop before their final frames when the outcome is an abort, so no client
    mistakes a failed generation for a complete answer (and nothing is recorded for it). A call whose event
    could not be made durable ends the same way, before its final frames.
    """
    failed: ApiError | None = None
    try:
        async for chunk in stream:
            yield chunk
    except RecordFailed as exc:
        # Refused at recording (a seal landed while it generated: 403 ``execution_sealed``) or not durable (500):
        # the error the same call gets unstreamed.
        failed = record_error(exc)
        outcome.finish = {"type": "abort", "message": failed.message, "status_code": failed.status}
    if failed is None and outcome.kind == "abort" and outcome.finish is not None:
        msg = str(outcome.finish.get("message", "the generation was aborted"))
        # No engine could finish (503/529) is an overload; anything else (a bad engine reply) is not.
        if outcome.finish.get("status_code") in (None, 503, 529):
            failed = ApiError(dialect.overloaded_status, "overloaded", msg, code="engine_unavailable")
        else:
            failed = ApiError(502, "api_error", msg, code="engine_error")
    if failed is not None:
        failed_with(failed.status)
        for frame in dialect.stream_error(failed):
            yield frame
