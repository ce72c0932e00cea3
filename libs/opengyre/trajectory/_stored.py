"""A model call's event with its token payload out of band (to append) or back in (to read).

The proxy's recorder splits every call before appending it; readers that need the tokens (the proxy's restore
and export, tools, tests) join them back from the payload stream. Stores decode a row's payload straight into a
tree node (``node_from_row``), never into an event.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..eventlog import EventLog
from ..events import ModelCallRecorded, PayloadRef
from ._calls import check_payload
from ._payload import PayloadError, PayloadUnavailable, TokenPayload, encode_payload, payload_digest

__all__ = ["join_payload", "resolve_calls", "split_payload"]


def split_payload(e: ModelCallRecorded) -> tuple[ModelCallRecorded, bytes]:
    """The event to append (no tokens, no context; a ``PayloadRef`` instead) and the payload bytes to store."""
    if e.payload is not None:
        raise ValueError(f"call {e.call_id} already has its payload out of band")
    raw = encode_payload(TokenPayload(e.prompt_delta_ids, e.output_ids, e.output_logprobs, e.context))
    ref = PayloadRef(
        digest=payload_digest(raw), size=len(raw), prompt_delta=len(e.prompt_delta_ids), output=len(e.output_ids)
    )
    slim = msgspec.structs.replace(e, prompt_delta_ids=[], output_ids=[], output_logprobs=[], context=None, payload=ref)
    return slim, raw


def join_payload(e: ModelCallRecorded, raw: bytes) -> ModelCallRecorded:
    """The event with its payload's tokens, logprobs and context back in (digest and lengths checked)."""
    ref = e.payload
    if ref is None:
        return e
    if payload_digest(raw) != ref.digest:
        raise PayloadError(f"call {e.call_id}: the payload's digest is not {ref.digest}")
    p = check_payload(f"call {e.call_id} of {e.execution_id}", raw, ref.prompt_delta, ref.output)
    return msgspec.structs.replace(
        e,
        prompt_delta_ids=list(p.prompt_delta_ids),
        output_ids=list(p.output_ids),
        output_logprobs=list(p.output_logprobs),
        context=p.context,
    )


async def resolve_calls(log: EventLog, events: Sequence[ModelCallRecorded]) -> list[ModelCallRecorded]:
    """The events with their payloads joined back in (inline ones as they are).

    Raises ``PayloadUnavailable`` (``payload-missing``, ``payload-corrupt``) for the first call whose payload
    cannot be read: a reader gets the recorded tokens or an error, never a guess."""
    keys = [(e.execution_id, e.payload.digest) for e in events if e.payload is not None]
    fetched = await log.payloads.get_many(keys)
    out: list[ModelCallRecorded] = []
    for e in events:
        if e.payload is None:
            out.append(e)
            continue
        key = (e.execution_id, e.payload.digest)
        if key in fetched.failed:
            raise PayloadUnavailable(
                fetched.failed[key], f"the payload of call {e.call_id} of {e.execution_id} is {fetched.failed[key]}"
            )
        out.append(join_payload(e, fetched.found[key]))
    return out
