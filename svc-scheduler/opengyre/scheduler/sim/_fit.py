"""A workload fitted from our own stores: execution durations from the scheduler's ledger (dispatch to finish,
by group), tokens per execution from the proxy's trajectory store. Written as a workload file, it runs in the
simulator like the shipped ones."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from sqlalchemy import Connection, inspect, select

from opengyre.trajectory import execution_sizes

from .._executions import EXECUTIONS
from .._state import as_seconds
from ._files import WorkloadFile
from ._workload import Durations, EmpiricalDurations, calibrate, stats_of

__all__ = ["StoreSample", "fit_workload", "read_store"]

HOUR = 3600.0
Kind = Literal["empirical", "fitted"]


@dataclass(frozen=True)
class StoreSample:
    groups_s: list[list[float]]  # complete groups' execution durations, seconds
    timeout_s: float
    skipped_groups: int  # incomplete, or of another size than the most common one
    context_tokens: float | None  # mean over executions of their largest call (prompt + output); None: no calls
    trained_tokens: float | None  # mean over executions of the tokens their trajectory tree stores
    executions_with_calls: int


def read_store(conn: Connection, *, timeout_h: float | None = None) -> StoreSample:
    """Complete groups from the scheduler's executions ledger; tokens from the trajectory store if present."""
    if not inspect(conn).has_table(EXECUTIONS.name):
        raise ValueError(f"no {EXECUTIONS.name} table: the scheduler projection has not run on this database")
    x = EXECUTIONS.c
    rows = conn.execute(select(x.group_id, x.status, x.dispatched_at, x.finished_at, x.timeout_s)).all()
    by_group: dict[str, list[float | None]] = defaultdict(list)
    timeouts = set()
    for r in rows:
        done = r.status != "running" and r.finished_at is not None
        by_group[r.group_id].append(as_seconds(r.finished_at) - as_seconds(r.dispatched_at) if done else None)
        timeouts.add(float(r.timeout_s))
    complete = [[d for d in g if d is not None] for g in by_group.values() if all(d is not None for d in g)]
    if not complete:
        raise ValueError("no group in the ledger has every execution finished")
    size = Counter(len(g) for g in complete).most_common(1)[0][0]
    groups = [g for g in complete if len(g) == size]
    if timeout_h is not None:
        timeout = timeout_h * HOUR
    else:
        known = {t for t in timeouts if t > 0}
        if len(known) != 1:
            raise ValueError(
                f"the executions carry {'no timeout' if not known else f'{len(known)} different timeouts'}: "
                "give the workload's timeout (--timeout-h)"
            )
        timeout = known.pop()
    over = [d for g in groups for d in g if d > timeout + 1e-3]  # event times have microseconds
    if over:
        raise ValueError(
            f"{len(over)} executions ran past the timeout {timeout / HOUR:g} h (up to {max(over) / HOUR:.2f} h): the "
            "ledger times dispatch to finish, so waiting for a slot counts; give --timeout-h at least that long to "
            "keep them as recorded"
        )
    context, trained, n = _tokens(conn)
    return StoreSample(groups, timeout, len(by_group) - len(groups), context, trained, n)


def _tokens(conn: Connection) -> tuple[float | None, float | None, int]:
    sizes = execution_sizes(conn)  # the proxy's trajectory store, if this database has it
    if not sizes:
        return None, None, 0
    largest = [s.largest_call for s in sizes]
    return float(np.mean(largest)), float(np.mean([s.stored_tokens for s in sizes])), len(sizes)


def fit_workload(
    sample: StoreSample, *, name: str, source: str, kind: Kind = "empirical", model_like: WorkloadFile | None = None
) -> WorkloadFile:
    """The sample as a workload: its recorded groups (``empirical``) or the three-parameter model fitted to
    their mean execution, mean query and share of queries over their 90th percentile (``fitted``). Model facts
    only with ``model_like`` (the store has no parameter counts): its facts, with the measured token counts."""
    d = np.asarray(sample.groups_s)
    q = d.max(axis=1)
    over_h = float(np.percentile(q, 90)) / HOUR
    st = stats_of(d, sample.timeout_s, over_h)
    published = {"mean_execution_h": st.mean_execution_h, "mean_query_h": st.mean_query_h,
                 "share_queries_over": st.share_queries_over, "over_h": over_h}  # fmt: skip
    assumed: dict[str, list[str]] = {"workload": []}
    durations: Durations
    if kind == "empirical":
        durations = EmpiricalDurations(name, tuple(tuple(g) for g in sample.groups_s), sample.timeout_s)
    else:
        durations = calibrate(
            name, mean_execution_h=st.mean_execution_h, mean_query_h=st.mean_query_h,
            share_queries_over=st.share_queries_over, over_h=over_h, timeout_s=sample.timeout_s,
            group_size=d.shape[1],
        ).model  # fmt: skip
    model = None
    if model_like is not None and model_like.model is not None:
        model = model_like.model
        # Taken from ``model_like``, not measured: assumptions for this workload.
        kept = ["params_b", "active_params_b", "attention_layers", "attention_width", "kv_bytes_per_token"]
        if sample.context_tokens is not None and sample.trained_tokens is not None:
            model = replace(model, name=f"{model.name} (tokens of {name})", context_tokens=sample.context_tokens,
                            trained_tokens=sample.trained_tokens)  # fmt: skip
        else:
            kept += ["context_tokens", "trained_tokens"]
        assumed["model"] = kept
    return WorkloadFile(
        name=name, source=source, durations=durations, published=published, model=model, assumed=assumed,
    )  # fmt: skip
