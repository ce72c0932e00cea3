"""Shared domain: the wire formats the proxy's gateway and the CPU engine both speak.

- ``openai`` / ``anthropic``: requests parsed into a ``GenRequest``, responses, SSE chunks and error bodies of
  OpenAI Chat Completions / Completions and Anthropic Messages (modules; the Responses dialect needs the
  proxy's execution state and stays in ``opengyre.proxy``).
- ``ApiError``: the dialect-neutral HTTP error each dialect formats into its own body.
- ``assemble`` / ``StreamAssembler`` / ``Outcome`` / ``Turn``: generated ids -> text and tool calls, at once or
  as a stream of pieces (what a harness gets back).
- ``Frame`` / ``DONE`` / ``framed``: a stream's events as objects, framed into SSE bytes once, at the edge;
  ``ToolChoice``, ``structured_sampling``, tool-definition checks; ``top_alternatives``: SGLang's per-token
  alternatives as ``(id, logprob)`` pairs.
"""

from . import anthropic, openai
from ._assembly import (
    Outcome,
    StreamAssembler,
    TextPiece,
    ToolCallOut,
    ToolPiece,
    Turn,
    arguments_object,
    assemble,
)
from ._errors import ApiError
from ._request import GenRequest, check_number, content_text
from ._sglang import finite_number, top_alternatives
from ._sse import DONE, Frame, framed
from ._structured import (
    ToolChoice,
    parse_forced_calls,
    response_format_schema,
    structured_sampling,
)
from ._tooldefs import ANTHROPIC_NAME, OPENAI_NAME, check_schema, check_tool_name

__all__ = [
    "ANTHROPIC_NAME",
    "DONE",
    "OPENAI_NAME",
    "ApiError",
    "Frame",
    "GenRequest",
    "Outcome",
    "StreamAssembler",
    "TextPiece",
    "ToolCallOut",
    "ToolChoice",
    "ToolPiece",
    "Turn",
    "anthropic",
    "arguments_object",
    "assemble",
    "check_number",
    "check_schema",
    "check_tool_name",
    "content_text",
    "finite_number",
    "framed",
    "openai",
    "parse_forced_calls",
    "response_format_schema",
    "structured_sampling",
    "top_alternatives",
]
