"""One retry policy for every wait on something that comes back (a restarting server, a consumer being
removed): exponential backoff with jitter, capped, through tenacity."""

from ._backoff import backoff

__all__ = ["backoff"]
