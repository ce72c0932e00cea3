"""A nats-py client with a cheaper header parser.

Every event carries two or three headers, and nats-py's parser spends ~20 µs per message checking each
character of each name; on a 1M-event rebuild that alone is 20 s. This parser keeps its results for
well-formed headers (``Name: value`` lines) and stays a drop-in for the private static method.
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
