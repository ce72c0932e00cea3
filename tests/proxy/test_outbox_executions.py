"""The outbox's per-execution counts and seals (kept in memory beside ``outbox_executions``) always say what the
table says: after puts, a put whose fsync failed (taken back), a seal, a prune, and a reopen of the file."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from opengyre.events import ModelCallRecorded
from opengyre.proxy.recording._outbox import ExecutionSealed, Outbox, OutboxError


def _call(execution_id: str, call_id: str) -> ModelCallRecorded:
    return ModelCallRecorded(
        execution_id=execution_id, call_id=call_id, prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-0.1]
    )


def _table(path: Path) -> dict[str, tuple[int, bool]]:
    with sqlite3.connect(path) as db:
        return {x: (n, bool(s)) for x, n, s in db.execute("SELECT execution_id, calls, sealed FROM outbox_executions")}


def _seen(ob: Outbox, ids: list[str]) -> dict[str, tuple[int, bool]]:
    return {x: (ob.calls(x), ob.sealed(x)) for x in ids if ob.calls(x) or ob.sealed(x)}


async def test_counts_and_seals_follow_the_table_through_put_failed_sync_seal_prune_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    in_log: dict[str, int] = {}
    ids = ["a", "b", "c"]
    ob = await Outbox(path, sealed_in_log=in_log.get).open()
    try:
        for i in range(3):
            fut = ob.put(_call("a", f"a{i}"))
            assert fut is not None
            await fut
        await ob.put(_call("b", "b0"))  # type: ignore[misc]
        assert _seen(ob, ids) == _table(path) == {"a": (3, False), "b": (1, False)}

        # A put whose fsync fails is taken back: its count goes with its row.
        wal, ob._wal = ob._wal, os.open(os.devnull, os.O_RDONLY)
        os.close(ob._wal)  # fsync of a closed descriptor fails (EBADF)
        fut = ob.put(_call("b", "b1"))
        assert fut is not None
        with pytest.raises(OutboxError):
            await fut
        ob._wal = wal
        assert _seen(ob, ids) == _table(path) == {"a": (3, False), "b": (1, False)}

        await ob.seal("a")
        await ob.seal("c")  # no call yet: sealed with none
        with pytest.raises(ExecutionSealed):
            ob.put(_call("a", "a9"))
        assert _seen(ob, ids) == _table(path) == {"a": (3, True), "b": (1, False), "c": (0, True)}
    finally:
        await ob.close()

    ob = await Outbox(path, sealed_in_log=in_log.get).open()
    try:
        assert _seen(ob, ids) == _table(path) == {"a": (3, True), "b": (1, False), "c": (0, True)}
        # The log holds c's sealed finish (a has rows still to drain, b is not sealed): only c's row goes, and the
        # log's count answers for it from then on.
        in_log["c"] = 0
        assert ob.prune(["a", "b", "c"]) == 1
        assert _table(path) == {"a": (3, True), "b": (1, False)}
        assert ob.sealed("c") and ob.calls("c") == 0
        with pytest.raises(ExecutionSealed):
            ob.put(_call("c", "c0"))
        rows = await ob.head(10)
        await ob.remove([r for r, _ in rows], 1)
        in_log["a"] = 3  # its rows left for the log, then its finish came
        assert ob.prune(["a"]) == 1
        assert _table(path) == {"b": (1, False)}
        assert _seen(ob, ids) == {"a": (3, True), "b": (1, False), "c": (0, True)}
    finally:
        await ob.close()
