"""How a harness ended -> the failure class the runtime reports: a crashed harness is not a trainable zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from opengyre.harness import HarnessSpec, HarnessTarget, run_harness
from opengyre.loop import harness_failure
from opengyre.sandbox import SandboxLimits


def ended(tmp_path: Path, script: str) -> object:
    spec = HarnessSpec("h", ("bash", "-c", script))
    target = HarnessTarget("http://127.0.0.1:59999/v1", "key", "tiny", tmp_path, "do it")
    return run_harness(spec, target, SandboxLimits(timeout_s=60))


@pytest.mark.parametrize(
    ("script", "calls", "failure"),
    [
        # The adversary's: garbage out, a summary that is not one, then a segfault: the harness's own fault.
        (
            """echo '{{"finish_reason": 42}}' > {summary_file}; head -c 20000 /dev/urandom; kill -SEGV $$""",
            0,
            "sandbox",
        ),
        ("kill -ABRT $$", 0, "sandbox"),  # a signal before any model call: nothing of the policy's ran
        # After a model call the policy's commands share the harness's user and sandbox: they could have sent it.
        ("kill -ABRT $$", 5, ""),
        ("exit 1", 0, "sandbox"),  # it never reached the model: nothing of the policy's ran
        ("exit 3", 2, ""),  # it called the model, then failed: graded on what it left (tests/e2e's crash)
        ("exit 0", 0, ""),
        # A SIGKILL with no OOM kill on the machine: from outside before any call (infrastructure), or, after
        # one, maybe the policy's own ``kill -9 $PPID``: graded, never masked as the OOM killer's.
        ("kill -9 $$", 0, "sandbox"),
        ("kill -9 $$", 3, ""),
    ],
)
def test_a_harness_killed_by_a_signal_or_failing_before_any_call_is_the_sandboxs_failure(
    tmp_path: Path, script: str, calls: int, failure: str
) -> None:
    outcome = ended(tmp_path, script)
    assert harness_failure(outcome, recorded_calls=calls) == failure  # type: ignore[arg-type]


# The built-in harness's summary lives where the policy's commands can write too (they run as its user, in its
# sandbox): a command that writes "the model failed" into it must not get a failing attempt masked as the engine's.
FORGED = (
    """echo '{{"finish_reason": "model-error", "message": "the model endpoint failed"}}' > {summary_file}; exit 5"""
)


@pytest.mark.parametrize(
    ("calls", "failed", "failure"),
    [
        (3, 0, ""),  # calls recorded, none failed at the proxy: the summary's word alone is not believed
        (3, 1, "engine"),  # the proxy answered one of its calls with a failure: the engine's, masked
        (0, 0, "engine"),  # no call ever recorded: nothing of the policy's ran that could have forged it
    ],
)
def test_a_summary_saying_the_model_failed_masks_only_what_the_proxy_confirms(
    tmp_path: Path, calls: int, failed: int, failure: str
) -> None:
    outcome = ended(tmp_path, FORGED)
    assert outcome.finish_reason == "model-error"  # type: ignore[attr-defined]
    assert harness_failure(outcome, recorded_calls=calls, failed_calls=failed) == failure  # type: ignore[arg-type]
