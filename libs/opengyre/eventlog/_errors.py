"""Errors of the event log, independent of the NATS client's exception classes."""

from __future__ import annotations

__all__ = ["ConcurrencyError", "EventLogError", "LogUnavailable"]

# JetStream: 10071 "wrong last sequence: {seq}" (single server) and 10164 "wrong last sequence" (clustered
# or batched path). Both mean another writer appended to the aggregate first.
WRONG_LAST_SEQUENCE_CODES = frozenset({10071, 10164})
# JetStream: 10023 "insufficient resources" (the server's storage limit, by default 75% of the disk it started
# on) and 10047 "insufficient storage resources available".
STORAGE_FULL_CODES = frozenset({10023, 10047})


class EventLogError(Exception):
    pass


class ConcurrencyError(EventLogError):
    """An append's expected last subject sequence did not match: another writer got there first."""

    def __init__(self, subject: str, expected: int, detail: str = "") -> None:
        super().__init__(f"append to {subject} expected last sequence {expected}: {detail or 'wrong last sequence'}")
        self.subject = subject
        self.expected = expected


class LogUnavailable(EventLogError):
    """The NATS server did not answer, answers without JetStream, or cannot store (a full disk)."""
