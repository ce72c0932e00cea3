"""What every command line builds its commands with: the shared options (``--data-dir``, ``--nats-url``, ...),
settings from them, the console, a clean failure, and a session on the event log.

Kernel, not the CLI app: each service's ``cli.register`` uses these, and a service never imports an app (issue 25).
"""

from ._common import DataDirOpt, DbUrlOpt, NatsUrlOpt, StreamOpt, console, fail, log_session, settings_from

__all__ = [
    "DataDirOpt",
    "DbUrlOpt",
    "NatsUrlOpt",
    "StreamOpt",
    "console",
    "fail",
    "log_session",
    "settings_from",
]
