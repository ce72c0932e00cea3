"""Shared domain: token-in/token-out (TITO) prompt planning for one execution, and a reference conversation
replayed as the proxy would record it.

- ``ExecutionTrajectory`` / ``Plan`` / ``TitoNode``: each call's prompt extends the previous call's prompt and
  output ids; retries, rewrites and drift (the proxy's gateway plans every call through it).
- ``replay_conversation``: a whole OpenAI conversation with tools, call by call, through the OpenAI dialect's
  parsing, TITO planning and ``ChatCodec.reply_ids`` (the trainer's SFT samples come from there).
- ``canon_message`` / ``tools_key``: what makes two turns, and two tool lists, the same.
"""

from ._replay import replay_conversation
from ._trajectory import ExecutionTrajectory, Plan, TitoNode, canon_message, tools_key

__all__ = ["ExecutionTrajectory", "Plan", "TitoNode", "canon_message", "replay_conversation", "tools_key"]
