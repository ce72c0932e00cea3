"""The indexed state and simulator decide exactly what the scanning versions did: the policies against their
earlier scan-every-cell code as an oracle at every decision, the state's indexes against brute force over
random event sequences, and the simulator's queue, slots, accounting and event-free fold against plain ones."""

from __future__ import annotations

import contextlib
import gc
import heapq
from dataclasses import asdict, replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from opengyre.events import Event
from opengyre.projection import Rejected
from opengyre.scheduler import (
    TRAINING_ROLES,
    CellState,
    Decision,
    Policy,
    RoleRequest,
    SchedulerState,
    View,
    dispatchable,
    watermark_allows,
)
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import EPOCH, EventQueue, Slots, Usage, at_seconds, simulate

from ._small import small_config
from .conftest import scheduler_events

# --- the policies' earlier code, scanning every cell: the oracle -------------------------------------------


def _cells(st: SchedulerState) -> list[CellState]:
    return sorted(st.cells.values(), key=lambda c: c.order)


def _to_training(c: CellState) -> bool:
    return c.role == "draining" or (c.role == "switching" and c.switch_from not in TRAINING_ROLES)


def _to_rollout(c: CellState) -> bool:
    return c.role == "switching" and c.switch_from in TRAINING_ROLES


def _elastic(policy: Any, view: View) -> Decision:
    st, loop = view.state, view.loop
    dispatch = policy.dispatch(view)
    cells = _cells(st)
    demand = st.watermark + sum(d.groups for d in dispatch) * loop.group_size
    supply = st.rollout_capacity + sum(c.capacity for c in cells if _to_rollout(c))
    if demand > supply:
        back: list[RoleRequest] = []
        for c in reversed(cells):
            if supply >= demand:
                break
            if c.role in TRAINING_ROLES:
                back.append(RoleRequest(c.cell_id, "rollout", f"burst needs capacity: w={demand} > CR={supply}"))
                supply += c.capacity
        return Decision(tuple(back), dispatch)
    if any(_to_training(c) for c in cells):
        return Decision((), dispatch)
    nxt = next((c for c in cells if c.role == "rollout" and not c.resident), None)
    if nxt is None:
        return Decision((), dispatch)
    n_training = sum(1 for c in cells if c.role in TRAINING_ROLES)
    ready = -(-st.ready_group_count // loop.micro_groups) * loop.micro_splits
    if not watermark_allows(demand, st.rollout_capacity, nxt.capacity) or ready < policy.ready_per_cell * (
        n_training + 1
    ):
        return Decision((), dispatch)
    why = f"w={demand} <= CR-Ce={st.rollout_capacity - nxt.capacity}; ready={ready}"
    return Decision((RoleRequest(nxt.cell_id, "training", why),), dispatch)


def _colocate(policy: Any, view: View) -> Decision:
    st = view.state
    pool = [c for c in _cells(st) if not c.resident]
    if any(c.role in ("draining", "switching") for c in pool):
        return Decision()
    training = [c for c in pool if c.role in TRAINING_ROLES]
    if training:
        if st.ready_samples == 0:
            why = "burst trained; back to rollout"
            return Decision(tuple(RoleRequest(c.cell_id, "rollout", why) for c in reversed(training)))
        return Decision()
    leaving = sum(c.capacity for c in pool if c.role == "rollout")
    if st.ready_samples > 0 and st.watermark <= st.rollout_capacity - leaving:
        why = "the burst's unfinished executions fit on the resident pool" if leaving < st.rollout_capacity else (
            "every execution of the burst finished")  # fmt: skip
        return Decision(tuple(RoleRequest(c.cell_id, "training", why) for c in pool if c.role == "rollout"))
    if st.ready_samples == 0:
        return Decision((), dispatchable(view))
    return Decision()


def _async(policy: Any, view: View) -> Decision:
    pool = [c for c in _cells(view.state) if not c.resident]
    k = min(policy.train_cells, len(pool) - (0 if len(pool) < len(view.state.cells) else 1))
    want = {c.cell_id for c in pool[:k]}
    roles = tuple(
        RoleRequest(c.cell_id, "training", f"fixed training pool of {policy.train_cells}")
        for c in pool
        if c.cell_id in want and c.role == "rollout"
    )
    return Decision(roles, dispatchable(view))


ORACLES = {"elastic": _elastic, "elastic-carry": _elastic, "colocate": _colocate, "colocate-resident": _colocate,
           "async": _async, "async-streaming": _async}  # fmt: skip


def _checked(name: str, **params: int) -> tuple[Policy, list[int]]:
    """The real policy, asserting at every decision that the scanning oracle decides the same."""
    real = make_policy(name, **params)
    count = [0]

    class Checked(type(real)):  # type: ignore[misc]
        def decide(self, view: View) -> Decision:
            d = super().decide(view)
            assert d == ORACLES[name](self, view)
            count[0] += 1
            return d

    return Checked(**asdict(real)), count


@pytest.mark.parametrize("name", sorted(ORACLES))
@pytest.mark.parametrize("layout", ["small", "residents", "64 cells, mixed GPUs"])
def test_the_indexed_policies_decide_what_scanning_every_cell_decided(name: str, layout: str) -> None:
    cfg = small_config(steps=4, resident=1 if layout == "residents" else 0)
    if layout.startswith("64"):
        cfg = replace(cfg, cluster=replace(cfg.cluster, cells=64, cell_gpus=(16, 4, 8, 4)))
    params = {"train_cells": 2} if name.startswith("async") else {}
    policy, count = _checked(name, **params)
    simulate(cfg, policy)
    assert count[0] > 10


# --- the state's indexes against brute force ---------------------------------------------------------------


def _check_indexes(s: SchedulerState) -> None:
    cells = _cells(s)
    pool = [c for c in cells if not c.resident]
    assert s.cells_in_order() == cells
    assert s.pool == pool and [s.pool_rank(c) for c in pool] == list(range(len(pool)))
    assert s.training_cells() == [c for c in cells if c.role in TRAINING_ROLES]
    assert list(s.training_cells_reversed()) == [c for c in reversed(cells) if c.role in TRAINING_ROLES]
    rollout_pool = [c for c in pool if c.role == "rollout"]
    assert list(s.rollout_pool_cells()) == rollout_pool
    assert s.first_rollout_pool_cell() == (rollout_pool[0] if rollout_pool else None)
    sats = [c for c in cells if c.role == "training-satellite"]
    assert s.first_satellite() == (sats[0] if sats else None)
    assert s.training_count == len(s.training_cells())
    assert s.core_count == sum(c.role == "training-core" for c in cells)
    assert s.heading_to_training_count == sum(_to_training(c) for c in cells)
    assert s.heading_to_rollout_capacity == sum(c.capacity for c in cells if _to_rollout(c))
    assert s.pool_moving_count == sum(c.role in ("draining", "switching") for c in pool)
    assert s.pool_rollout_capacity == sum(c.capacity for c in rollout_pool)
    assert s.rollout_capacity == sum(c.capacity for c in cells if c.role == "rollout")
    for role in ("idle", "rollout", "draining", "switching", "training-core", "training-satellite"):
        assert s.gpus_in(role) == sum(c.gpus for c in cells if c.role == role)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler_events(max_size=80))
def test_the_role_indexes_match_a_scan_after_every_event(events: list[Event]) -> None:
    s = SchedulerState()
    for seq, e in enumerate(events, 1):
        with contextlib.suppress(Rejected):
            s.apply(e, seq)
        _check_indexes(s)
    # The live controller's load: the same cells restored from rows, indexes rebuilt.
    loaded = SchedulerState(cells={k: replace(c) for k, c in s.cells.items()}, groups=s.groups)
    loaded.restore_derived(ready_in_order=[g.group_id for g in s.ready_groups()])
    _check_indexes(loaded)
    assert loaded.untrained_by_version == s.untrained_by_version


# --- the simulator's own structures against plain ones ------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 500), st.integers(0, 3)), max_size=300))
def test_the_calendar_queue_pops_in_heap_order(ops: list[tuple[bool, float, int]]) -> None:
    q, h, now, tie = EventQueue(width=60.0), [], 0.0, 0
    for push, dt, kind in ops:
        if push or not h:
            tie += 1
            entry = (now + round(dt, 1), tie, kind, "k", None)  # rounded: equal times occur
            q.push(entry)
            heapq.heappush(h, entry)
        elif kind == 3:  # the engine's inner loop: the next entry only if it is due now
            got = q.pop_at(now)
            assert got == (heapq.heappop(h) if h[0][0] == now else None)
        else:
            got, want = q.pop(), heapq.heappop(h)
            assert got == want
            now = got[0]
        assert len(q) == len(h)
    while h:
        assert q.pop() == heapq.heappop(h)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["open", "close", "place", "place", "remove"]), st.integers(0, 5)),
                max_size=200))  # fmt: skip
def test_slots_place_on_the_least_loaded_open_cell(ops: list[tuple[str, int]]) -> None:
    slots, load, where, n = Slots(), {}, {}, 0
    for op, i in ops:
        cell = f"c{i}"
        if op == "open" and cell not in load:
            slots.open(cell, i, 3, 6)
            load[cell] = 0
        elif op == "close":
            moved = slots.close(cell)
            assert sorted(moved) == sorted(x for x, c in where.items() if c == cell)
            for x in moved:
                del where[x]
            load.pop(cell, None)
        elif op == "place":
            n += 1
            best = min(load, key=lambda c: (load[c], int(c[1:])), default=None)
            want = best if best is not None and load[best] < 3 else None
            assert slots.place(f"x{n}") == want
            if want is not None:
                load[want] += 1
                where[f"x{n}"] = want
        elif op == "remove" and where:
            x = sorted(where)[i % len(where)]
            assert slots.remove(x, where[x]) == 2.0
            load[where.pop(x)] -= 1
        assert slots.busy == len(where) and slots.busy_gpus == pytest.approx(2.0 * len(where))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.integers(0, 4), st.floats(-8, 8)), max_size=60), st.floats(0, 500))
def test_usage_integrates_the_step_functions_exactly(jumps: list[tuple[float, int, float]], extra: float) -> None:
    jumps = sorted(jumps)
    u = Usage(bin_s=60.0)
    for t, k, d in jumps:
        u.jump(k, t, d)
    end = (jumps[-1][0] if jumps else 0.0) + extra
    series = [sum(d * (end - t) for t, kk, d in jumps if kk == k) for k in range(5)]
    busy, roll, tbusy, train, other = series
    want = [busy, roll - busy, tbusy, train - tbusy, other]
    assert u.totals(end) == pytest.approx(want, abs=1e-6 * (1 + max(map(abs, want), default=0)))


@pytest.mark.parametrize("name", ["elastic", "elastic-carry", "colocate-resident"])
def test_the_event_free_fold_gives_what_the_recorded_events_give(name: str) -> None:
    # Without recording, the simulator folds dispatches and finishes through the same state code but builds
    # no event objects; the run must be the same.
    cfg = small_config(steps=5, resident=1 if name == "colocate-resident" else 0)
    fast, recorded = simulate(cfg, make_policy(name)), simulate(replace(cfg, record_events=True), make_policy(name))
    assert fast.summary() == recorded.summary()
    assert fast.timeline == recorded.timeline and fast.steps == recorded.steps


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e8, allow_nan=False))
# Half-microsecond ties (rounded to even) and fractions just beside them, where a rounding slip would show.
@example(2.5e-6)
@example(3.5e-6)
@example(0.0000005)
@example(1.0000015)
@example(12345.0000025)
@example(86400.4999995)
@example(0.9999995)
def test_the_fast_timestamp_is_the_folds_timestamp_bit_for_bit(t: float) -> None:
    assert at_seconds(t) == (EPOCH + timedelta(seconds=t)).timestamp()  # as_seconds of an aware datetime


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.lists(st.integers(0, 3), max_size=4), st.integers(1, 3),
                          st.integers(0, 2), st.sampled_from([0, 2, 4])), max_size=25))  # fmt: skip
def test_a_group_dispatched_at_once_folds_as_its_members_one_by_one(
    ops: list[tuple[bool, int, list[int], int, int, int]],
) -> None:
    # The simulator folds a burst group by group (``dispatch_group``); the live service folds the log event by
    # event (``dispatch_execution``). Late members of a complete group, duplicates, refusals: the same state.
    one, many = SchedulerState(), SchedulerState()
    for finish, g, members, step, version, size in ops:
        xids = [f"g{g}-e{k}" for k in members]
        if finish:  # finish whatever of the group is running, in both
            for xid in sorted(x for x in one.running if x.startswith(f"g{g}-")):
                one.finish_execution(xid, True, 10.0 * step)
                many.finish_execution(xid, True, 10.0 * step)
            continue
        args = (f"g{g}", step, f"v{version}", 5.0, 60.0, size)
        try:
            probe = SchedulerState(running=dict(one.running), finished=dict(one.finished))
            for xid in xids:
                probe.dispatch_execution(xid, *args)
        except Rejected:
            before = many.snapshot()
            with pytest.raises(Rejected):  # refused as a whole, and nothing of it applied
                many.dispatch_group(xids, *args)
            assert many.snapshot() == before
            continue
        for xid in xids:
            one.dispatch_execution(xid, *args)
        many.dispatch_group(xids, *args)
        assert many.snapshot() == one.snapshot()
        assert many.untrained_by_version == one.untrained_by_version and many.ready_rev == one.ready_rev


def test_a_run_pauses_the_cyclic_collector_and_restores_it() -> None:
    cfg = small_config(steps=2)
    assert gc.isenabled()
    simulate(cfg, make_policy("elastic"))
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(cfg, make_policy("elastic"))
        assert not gc.isenabled()  # a caller's choice is left as it was
    finally:
        gc.enable()
