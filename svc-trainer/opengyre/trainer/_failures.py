"""Failure classes: infrastructure noise told apart from model capability before anything is trained.

Classified by *where* the failure happened, from exit statuses and signals the system observes itself, never
from text the agent controls (an agent's program can print "MemoryError" or "Could not resolve host"; reading
that as infrastructure would let it turn its failures into masked samples):

- the agent's process killed by SIGKILL (exit 137) from outside: the OOM killer or the orchestrator, infra;
- the agent's process ended by ``timeout(1)`` (exit 124): the execution's time ran out, graded as is;
- the grader's sandbox failing to start or copy: infra (``sandbox``);
- the grader running past its time limit, its processes exceeding the sandbox's memory or filling its disk quota:
  the agent's code under test hung, exhausted memory or filled the disk (``agent-timeout``, ``agent-oom``,
  ``agent-disk``), scored 0;
- the grader killed by a SIGKILL the sandbox did not send while the kernel counted an OOM kill: the system's OOM
  killer, infra (``oom``); killed by any other signal the sandbox did not send, or by a SIGKILL with no OOM kill
  on the machine: the code under test killed its grader (``agent-killed``), scored 0, its reward file unread;
- failures the runtime reports itself (a network outage, an engine fault, an infrastructure-side tool timeout)
  arrive as a class from it, not from the agent's output.
"""

from __future__ import annotations

from opengyre.events import FailureClass

__all__ = ["AGENT_CLASSES", "INFRA_CLASSES", "REPORTABLE_CLASSES", "TRANSIENT_CLASSES", "classify_failure"]

# No valid learning signal at all: the execution is replaced by nothing (masked).
INFRA_CLASSES: frozenset[FailureClass] = frozenset({"oom", "sandbox", "engine"})
# Recoverable hiccups (an infrastructure-side tool call timed out, the network stalled): filtered, behind a
# circuit breaker.
TRANSIENT_CLASSES: frozenset[FailureClass] = frozenset({"timeout", "network"})
# The agent's own code hung or exhausted memory while graded: a real failure, scored 0 and trained.
AGENT_CLASSES: frozenset[FailureClass] = frozenset({"agent-timeout", "agent-oom", "agent-disk", "agent-killed"})
# What the runtime that ran the agent may report it observed (``score_execution(failure=...)``).
REPORTABLE_CLASSES: frozenset[FailureClass] = INFRA_CLASSES | TRANSIENT_CLASSES


def classify_failure(exit_code: int | None) -> FailureClass | None:
    """The failure class of how the agent's process ended, or None when nothing points at infrastructure.

    137 is a SIGKILL the agent's process did not send itself in any normal run (the OOM killer, an orchestrator
    reclaiming the machine). 124 is the execution's own time limit (``timeout(1)``): not a failure class, the
    execution is graded as timed out."""
    return "oom" if exit_code == 137 else None
