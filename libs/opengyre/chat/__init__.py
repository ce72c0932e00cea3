"""Shared domain: chat messages <-> tokens for the served model (the chat template and its parsing).

The proxy (TITO), the CPU engine and the trainer's SFT all render through this one codec, so a message list
becomes the same tokens wherever it is rendered; it lives outside every service so none imports another's.
"""

from ._codec import ChatCodec, IncrementalDecoder, parse_tool_call

__all__ = ["ChatCodec", "IncrementalDecoder", "parse_tool_call"]
