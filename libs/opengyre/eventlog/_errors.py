"""Errors of the event log, independent of the NATS client's exception classes."""

from __future__ import annotations

__all__ = ["ConcurrencyError", "EventLogError", "LogUnavailable", "NoQuorum"]

# JetStream: 10071 "wrong last sequence: {seq}" (single server) and 10164 "wrong last sequence" (clustered
# or batched path). Both mean another writer appended to the aggregate first.
WRONG_LAST_SEQUENCE_CODES = frozenset({10071, 10164})
# JetStream: 10023 "insufficient resources" (the server's storage limit, by default 75% of the disk it started
# on) and 10047 "insufficient storage resources available".
STORAGE_FULL_CODES = frozenset({10023, 10047})
# JetStream: 10008 "JetStream system temporarily unavailable" (a leader election in progress) and 10158 "duplicate
# message id is in process" (an earlier attempt of the same append is still being stored): both pass.
ELECTION_CODES = frozenset({10008})
IN_PROCESS_CODES = frozenset({10158})
# JetStream: 10077 "Generic error when storing a message failed": the store refused it, and would again.
STORE_FAILED_CODES = frozenset({10077})


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


class NoQuorum(LogUnavailable):
    """A replicated stream elected no leader in time: a majority of its servers is gone. Nothing was dropped
    silently: the append was not acknowledged, and retrying it once a majority is back stores it once."""
