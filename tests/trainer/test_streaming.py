"""Streaming micro-steps with satellites: the same update as one worker over the same micro-batches."""

from __future__ import annotations

import threading

import pytest
import torch

from opengyre.models import model_config
from opengyre.trainer import (
    Learner,
    MicroStepBuffer,
    PreparedStep,
    Satellite,
    TrainingSample,
    snapshot_digest,
    staleness,
    streaming_step,
)
from opengyre.trainer.algorithms import GSPO
from opengyre.trainer.backends import build_backend

from .._polling import wait_until
from .test_backends import batches


def test_buffer_claims_are_atomic_and_complete() -> None:
    mbs = batches(48)
    buf = MicroStepBuffer()
    got: list[int] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while (mb := buf.claim(name)) is not None:
            with lock:
                got.append(id(mb))

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for mb in mbs:
        buf.put(mb)
    buf.close()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(id(m) for m in mbs) and sum(buf.claims.values()) == len(mbs)
    with pytest.raises(RuntimeError):
        buf.put(mbs[0])


@pytest.mark.parametrize("satellite_backend", ["torch", "megatron"])
def test_streaming_with_a_satellite_equals_one_worker(satellite_backend: str) -> None:
    cfg = model_config("tiny")
    mbs = batches(48)
    assert len(mbs) >= 4
    reference = build_backend("torch", cfg, seed=2)
    ref = Learner(reference, GSPO(eps_low=0.1, eps_high=0.1), lr=1e-2)
    ref_result = ref.step(mbs)

    core_backend = build_backend("torch", cfg, seed=2)
    core = Learner(core_backend, GSPO(eps_low=0.1, eps_high=0.1), lr=1e-2)
    sat = Satellite("sat0", build_backend(satellite_backend, cfg, seed=99), GSPO(eps_low=0.1, eps_high=0.1))
    buf = MicroStepBuffer()

    def produce() -> None:  # data arrives while the step is already running
        for mb in mbs:
            buf.put(mb)
        buf.close()

    producer = threading.Thread(target=produce)
    producer.start()
    result = streaming_step(core, buf, [sat])
    producer.join()
    assert sum(buf.claims.values()) == len(mbs) == result.micro_steps
    assert sat.joined_digest == snapshot_digest(reference_initial(cfg))  # joined with the core's weights
    assert result.loss == pytest.approx(ref_result.loss, rel=1e-4, abs=1e-7)
    assert result.grad_norm == pytest.approx(ref_result.grad_norm, rel=1e-4)
    assert result.n_samples == ref_result.n_samples
    a, b = core_backend.hf_state_dict(), reference.hf_state_dict()
    for k in a:
        # Adam's first update is ~lr * sign(grad): where a gradient is near zero, float-level noise (another
        # summation order, another CPU's vector unit) moves a weight by up to a fraction of lr (1e-2).
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-4)


def reference_initial(cfg):  # type: ignore[no-untyped-def]
    return build_backend("torch", cfg, seed=2).hf_state_dict()


def test_a_satellite_joins_a_running_step_on_the_step_start_snapshot() -> None:

    from opengyre.trainer import StreamingStep

    cfg = model_config("tiny")
    mbs = batches(48)
    ref_backend = build_backend("torch", cfg, seed=2)
    ref = Learner(ref_backend, GSPO(eps_low=0.1, eps_high=0.1), lr=1e-2).step(mbs)

    core_backend = build_backend("torch", cfg, seed=2)
    core = Learner(core_backend, GSPO(eps_low=0.1, eps_high=0.1), lr=1e-2)
    buf = MicroStepBuffer()
    step = StreamingStep(core, buf)
    out: list[object] = []
    runner = threading.Thread(target=lambda: out.append(step.finish()))
    runner.start()
    buf.put(mbs[0])
    wait_until(
        lambda: buf.claims.get("core", 0) >= 1,
        "the step is running: the core has taken its first micro-batch",
        polls=12000,
        every=0.01,
    )
    sat = Satellite("late", build_backend("megatron", cfg, seed=77), GSPO(eps_low=0.1, eps_high=0.1))
    step.join(sat)
    for mb in mbs[1:]:
        buf.put(mb)
    buf.close()
    runner.join()
    [result] = out
    assert isinstance(result, type(ref))
    assert sat.joined_digest == step.digest  # the snapshot of the step's start, not whatever came later
    assert result.micro_steps == len(mbs) == sum(buf.claims.values())
    assert result.loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-7)
    got, want = core_backend.hf_state_dict(), ref_backend.hf_state_dict()
    for k in want:  # after Adam: a fraction of lr, as above
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError):
        step.join(Satellite("too-late", build_backend("torch", cfg), GSPO()))


def test_merged_parts_of_a_step_average_staleness_over_tokens() -> None:
    # A streaming step prepares group by group; the merged mean is the mean over all target tokens.
    def sample(eid: str, n: int, version: str) -> TrainingSample:
        return TrainingSample(
            execution_id=eid,
            leaf="l",
            tokens=tuple(range(1, n + 2)),
            targets=(False, *[True] * n),
            behaviour_logprobs=(0.0, *[-1.0] * n),
            advantage=1.0,
            token_weight=0.1,
            weight_versions=("", *[version] * n),
            temperatures=(1.0,) * (n + 1),
        )

    steps, step = {"v1": 1, "v5": 5}, 7
    parts = []
    for s in ([sample("a", 3, "v1")], [sample("b", 1, "v5")]):
        st = staleness(s, steps, step)
        parts.append(PreparedStep(step, samples=list(s), staleness_mean=st.mean, staleness_max=st.max))
    merged = parts[0]
    merged.merge(parts[1])
    whole = staleness(merged.samples, steps, step)
    assert (merged.staleness_mean, merged.staleness_max) == (pytest.approx(whole.mean), whole.max)
    assert whole.mean == pytest.approx((3 * 5 + 1 * 1) / 4)
