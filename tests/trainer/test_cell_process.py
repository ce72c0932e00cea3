"""Satellite cells in their own processes (a gloo group with the core): joining mid-step, leaving mid-step and
dying mid-step, each against the same data trained by one process."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from opengyre.models import model_config
from opengyre.trainer import CellHub, Learner, MicroStepBuffer, ProcessSatellite, StepResult, StreamingStep
from opengyre.trainer.algorithms import GSPO
from opengyre.trainer.backends import build_backend

from .._polling import wait_until
from .test_backends import batches

PARAMS = {"eps_low": 0.1, "eps_high": 0.1}


@pytest.fixture(scope="module")
def hub() -> CellHub:
    return CellHub()


@pytest.fixture
def cell(hub: CellHub) -> Iterator[ProcessSatellite]:
    sat = hub.start("cell-1", "torch", model_config("tiny"), "gspo", PARAMS)
    try:
        yield sat
    finally:
        sat.close()


def _one_process(mbs: list) -> tuple[StepResult, dict[str, torch.Tensor]]:  # type: ignore[type-arg]
    backend = build_backend("torch", model_config("tiny"), seed=2)
    result = Learner(backend, GSPO(**PARAMS), lr=1e-2).step(mbs)
    return result, backend.hf_state_dict()


def _running_step() -> tuple[StreamingStep, MicroStepBuffer, list[StepResult | Exception], threading.Thread, Learner]:
    """A step already running on the core (its ``finish`` on a thread): the result, or what it raised, in ``out``."""
    core = Learner(build_backend("torch", model_config("tiny"), seed=2), GSPO(**PARAMS), lr=1e-2)
    buf = MicroStepBuffer()
    step = StreamingStep(core, buf)
    out: list[StepResult | Exception] = []

    def finish() -> None:
        try:
            out.append(step.finish())
        except Exception as exc:
            out.append(exc)

    runner = threading.Thread(target=finish)
    runner.start()
    return step, buf, out, runner, core


def _feed_until(buf: MicroStepBuffer, mbs: list, worker: str) -> int:  # type: ignore[type-arg]
    """Put micro-batches one at a time, each claimed before the next, until ``worker`` has claimed one."""
    i = 0
    while buf.claims.get(worker, 0) == 0 and i < len(mbs):
        buf.put(mbs[i])
        i += 1
        wait_until(lambda: sum(buf.claims.values()) == buf.produced, "the micro-batch was claimed", every=0.005)
    return i


def test_a_cell_process_that_joins_a_running_step_gives_the_update_of_one_process(cell: ProcessSatellite) -> None:
    mbs = batches(48)
    ref, want = _one_process(mbs)
    step, buf, out, runner, core = _running_step()
    buf.put(mbs[0])
    wait_until(lambda: buf.claims.get("core", 0) >= 1, "the core has taken its first micro-batch", every=0.005)
    step.join(cell)  # mid-step: the weights cross, then it claims
    fed = 1 + _feed_until(buf, mbs[1:], cell.name)
    for mb in mbs[fed:]:
        buf.put(mb)
    buf.close()
    runner.join()
    [result] = out
    assert isinstance(result, StepResult), result
    assert cell.joined_digest == step.digest  # it loaded the step-start weights, exactly
    assert buf.claims.get(cell.name, 0) >= 1 and len(cell.results) == buf.claims[cell.name]
    assert result.micro_steps == len(mbs) == sum(buf.claims.values())
    assert result.loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-7)
    assert result.grad_norm == pytest.approx(ref.grad_norm, rel=1e-4)
    got = core.backend.hf_state_dict()
    for k in want:  # after Adam's first update: a fraction of lr where a gradient is near zero (test_streaming)
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)


def test_a_cell_that_leaves_mid_step_keeps_what_it_did_and_the_core_does_the_rest(cell: ProcessSatellite) -> None:
    mbs = batches(48)
    ref, want = _one_process(mbs)
    step, buf, out, runner, core = _running_step()
    step.join(cell)
    fed = _feed_until(buf, mbs, cell.name)
    cell.leave()  # between micro-steps: the one it has is done, its gradients count
    for mb in mbs[fed:]:
        buf.put(mb)
    buf.close()
    runner.join()
    [result] = out
    assert isinstance(result, StepResult), result
    assert len(cell.results) >= 1
    assert result.micro_steps == len(mbs)
    assert result.loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-7)
    got = core.backend.hf_state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)
    # the same process serves the next step on the new weights
    step2, buf2, out2, runner2, _ = _running_step()
    step2.join(cell)
    buf2.put(mbs[0])
    buf2.close()
    runner2.join()
    [result2] = out2
    assert isinstance(result2, StepResult) and cell.joined_digest == step2.digest and result2.micro_steps == 1


def test_a_cell_process_killed_mid_step_fails_the_step_instead_of_losing_its_micro_batches(hub: CellHub) -> None:
    sat = hub.start("doomed", "torch", model_config("tiny"), "gspo", PARAMS)
    try:
        mbs = batches(48)
        step, buf, out, runner, _ = _running_step()
        step.join(sat)
        fed = _feed_until(buf, mbs, sat.name)
        sat.proc.kill()
        sat.proc.wait()
        for mb in mbs[fed:]:
            buf.put(mb)
        buf.close()
        runner.join()
        # the step is not applied with a dead cell's gradients missing: it fails, saying why
        [error] = out
        assert isinstance(error, RuntimeError) and "a satellite failed" in str(error), error
    finally:
        sat.close()
