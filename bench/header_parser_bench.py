"""The header parser override (``eventlog/_client.py``) against nats-py's own, per message, on our headers.

    .venv/bin/python bench/header_parser_bench.py

Both parsers must give the same dict (checked); the override stays only while it is measurably faster.
"""

from __future__ import annotations

import functools
import timeit

from nats.aio.client import Client

from opengyre.eventlog import FastHeaderClient

# What an event carries: the message id, the type, and the version when it is not 1.
RAW = b"Nats-Msg-Id: 0123456789abcdef0123456789abcdef\r\nOg-Type: execution-dispatched\r\nOg-Version: 2\r\n\r\n"
N = 200_000


def main() -> None:
    theirs, ours = Client._parse_header_lines, FastHeaderClient._parse_header_lines
    if theirs(RAW) != ours(RAW):
        raise SystemExit(f"the parsers disagree: {theirs(RAW)} != {ours(RAW)}")
    for name, parse in (("nats-py", theirs), ("override", ours)):
        best = min(timeit.repeat(functools.partial(parse, RAW), number=N, repeat=5)) / N
        print(f"{name:9s} {best * 1e6:6.2f} µs per message")


if __name__ == "__main__":
    main()
