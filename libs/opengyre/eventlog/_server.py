"""The nats-server features the log relies on, and the oldest server that has them all."""

from __future__ import annotations

import re

from ._errors import LogUnavailable

__all__ = ["MIN_SERVER_VERSION", "require_server_version"]

# 2.10: consumers with several filter subjects (``filter_subjects``), which a projection over a few aggregates
# uses; an older server ignores the field and delivers every subject, silently. Also the stream's ``created``.
# 2.11: ``Nats-Expected-Last-Subject-Sequence-Subject``, which keeps a shared aggregate's optimistic concurrency per
# aggregate under per-type subjects; an older server ignores the header and checks the subject alone, silently.
MIN_SERVER_VERSION = (2, 11, 0)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def require_server_version(version: str, url: str) -> None:
    """Raise :class:`LogUnavailable` unless ``version`` (the server's INFO) is at least ``MIN_SERVER_VERSION``."""
    need = ".".join(map(str, MIN_SERVER_VERSION))
    m = _VERSION.match(version.strip())
    if m is None:
        raise LogUnavailable(
            f"the NATS server at {url} reports version {version!r}; OpenGyre needs nats-server >= {need}"
        )
    found = tuple(int(g) for g in m.groups())
    if found < MIN_SERVER_VERSION:
        raise LogUnavailable(
            f"the NATS server at {url} is nats-server {version}; OpenGyre needs nats-server >= {need} "
            "(consumers with several filter subjects, which an older server silently ignores)"
        )
