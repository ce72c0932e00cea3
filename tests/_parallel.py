"""How the suite is shared out among pytest-xdist workers (`make test`; docs/CONTRIBUTING.md, "Running the
tests"): one test at a time to whichever worker is free, except the modules of ``STACK_MODULES``, all of whose
tests run on one worker, one after the other, and each module of ``WHOLE_MODULES``, whose tests share a costly
module fixture (one worker builds it once, instead of each worker that gets one of its tests).

Every test has its own nats-server, stream, data dir and database, so tests may run at once, with one exception:
stacks that `opengyre up` starts. They used to race for the default gRPC ports (50051...); services now bind their
ports themselves and report them (tests/libs/runtime/test_supervisor_ports.py), but the grouping stays until the
suite has run without it (two stack modules at once also load both cores). A new module that starts stacks belongs
in ``STACK_MODULES``.

(xdist's own ``--dist loadgroup`` would do this with an ``xdist_group`` mark, but xdist 3.8 names a grouped test by
assigning ``item._nodeid``, which pytest 9 no longer reads: the mark is silently ignored. Hence the scheduler here.)
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

__all__ = ["STACK_MODULES", "WHOLE_MODULES", "SuiteScheduling"]

STACK_MODULES = frozenset(
    {
        "tests/apps/cli/test_cli.py",
        "tests/apps/cli/test_stack.py",
        "tests/apps/cli/test_faults.py",
        "tests/e2e/test_soak.py",
        "tests/e2e/test_attach.py",
        "tests/e2e/test_closed_loop.py",  # run_loop starts a stack, as `opengyre up` does
        "tests/e2e/test_driver_resume.py",  # `opengyre train loop` starts one
        "tests/e2e/test_real_harness_loop.py",  # run_loop, with a real harness
        "tests/e2e/test_streaming_groups.py",  # run_loop starts a stack
        "tests/proxy/test_real_harnesses.py",  # Claude Code behind SmolLM2 on `opengyre up`
    }
)
STACK_GROUP = "opengyre-up-stacks"
WHOLE_MODULES = frozenset(
    {
        "tests/trainer/test_smollm2.py",  # torch_backend: SmolLM2 loaded and built into a backend
    }
)


class SuiteScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a scope per test, but one for all tests of ``STACK_MODULES`` and one per
    module of ``WHOLE_MODULES``. Scopes go out largest first (so the stack group starts at once), then in
    collection order, one to each free worker."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module in STACK_MODULES:
            return STACK_GROUP
        return module if module in WHOLE_MODULES else nodeid
