"""A nats-py client with a cheaper header parser.

Every event carries two or three headers, and nats-py's parser checks each character of each name: about
twice as slow per message (``bench/header_parser_bench.py``, docs/benchmarks.md), ~3.6 s of a 1M-event
rebuild. This parser keeps its results for well-formed headers (``Name: value`` lines) and stays a drop-in
for the private static method.
"""

from __future__ import annotations

from nats.aio.client import Client

__all__ = ["FastHeaderClient"]


class FastHeaderClient(Client):
    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if sep and name:
                out[name.strip().decode("ascii", "replace")] = value.strip().decode("utf-8", "replace")
        return out
