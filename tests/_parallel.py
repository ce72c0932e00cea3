"""Tests that must not run at the same time as each other when the suite runs in parallel (pytest-xdist, `make
test`; docs/CONTRIBUTING.md, "Running the tests").

Every test has its own nats-server, stream, data dir and database, so tests may run at once, with one exception:
a stack that `opengyre up` starts takes the default gRPC ports (50051...) when it finds them free, and two stacks
starting at the same moment can both find them free; the loser's service cannot bind, and the supervisor's port
check then sees the winner's service on that port. The modules that start stacks are marked ``STACKS``:
``--dist loadgroup`` runs every test of the group on one worker, one after the other.
"""

from __future__ import annotations

import pytest

__all__ = ["STACKS"]

STACKS = pytest.mark.xdist_group("opengyre-up-stacks")
