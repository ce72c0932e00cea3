"""The reference harness: a terminal agent that knows only a base URL and an API key.

It speaks OpenAI chat completions with tool calls (the official ``openai`` SDK), runs the model's commands in
the workspace, compacts its context past a token budget, and can hand a sub-task to a sub-agent. Roles reach
the proxy in the ``x-opengyre-role`` header (``main``, ``main-summary``, ``sub-agent``, ``sub-agent-summary``),
so the trajectory tree tells the conversations apart: a sub-agent's calls are a root of their own, a summary
request forks off the conversation it summarises, and the compacted conversation starts a new branch.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import openai

from ._tools import Toolbox, ToolError, function_schema, parse_arguments

__all__ = ["AgentConfig", "AgentSummary", "FinishReason", "run_agent"]

FinishReason = Literal["submitted", "max-turns", "timeout", "model-error"]
ROLE_HEADER = "x-opengyre-role"

MAIN_SYSTEM = (
    "You are an autonomous agent working in a terminal. The workspace is your current directory. Use the tools to "
    "inspect and change it; call submit when the task is done."
)
SUB_SYSTEM = (
    "You are a sub-agent working on one sub-task in a terminal, inside the workspace. Use the tools; call submit "
    "with your result when done."
)
NUDGE = "Continue with a tool call; call submit when the task is done."
SUMMARY_REQUEST = (
    "Your context is about to be compacted. Summarise the work so far for yourself: what was done, what was "
    "learnt, what is left. Reply with the summary only."
)


@dataclass(frozen=True)
class AgentConfig:
    base_url: str
    api_key: str
    model: str
    workdir: Path
    max_turns: int = 50  # model calls of the main conversation
    sub_agent_max_turns: int = 20
    time_limit_s: float | None = None  # the whole episode, model calls and commands together
    command_timeout_s: float = 60.0
    max_output_chars: int = 16_000  # a tool result's text is cut to this (head and tail)
    context_budget_tokens: int = 8_000  # past it (prompt + completion of the last call) the context is compacted
    max_tokens: int | None = None
    temperature: float | None = None
    max_retries: int = 2  # the SDK's own retries (connection errors, 408/409/429/5xx, with backoff)
    sub_agents: bool = True
    command_network: bool = False

    def __post_init__(self) -> None:
        for name in ("max_turns", "sub_agent_max_turns", "context_budget_tokens", "max_output_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        for name in ("time_limit_s", "command_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0")


@dataclass
class AgentSummary:
    finish_reason: FinishReason | None = None
    turns: int = 0  # model calls of the main conversation
    model_calls: int = 0  # every call: main, sub-agents, summaries
    tool_calls: int = 0
    tool_errors: int = 0
    compactions: int = 0
    sub_agents: int = 0
    answer: str | None = None  # what submit said
    message: str = ""  # why it stopped, for anything but submitted

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


SUBMIT = function_schema(
    "submit",
    "Finish: the task is done. Optionally say what you did or found.",
    {"answer": {"type": "string"}},
    [],
)
SPAWN = function_schema(
    "spawn_agent",
    "Hand a self-contained sub-task to a sub-agent with a fresh context; returns its result.",
    {"task": {"type": "string", "description": "what the sub-agent should do"}},
    ["task"],
)


def agent_tools(role: Literal["main", "sub-agent"] = "main", *, sub_agents: bool = True) -> list[Any]:
    """The tool definitions the agent sends with every call in ``role`` (SFT renders its conversations with them)."""
    return [*Toolbox.SCHEMAS, SUBMIT, *([SPAWN] if role == "main" and sub_agents else [])]


class _ContextFull(Exception):
    """The endpoint refused the prompt as longer than the model's context (400 ``context_length_exceeded``)."""


class _Stop(Exception):
    def __init__(self, reason: FinishReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Conversation:
    """One agent's conversation (the main one or a sub-agent's): call, run tools, compact, until it stops."""

    run: _Episode
    role: Literal["main", "sub-agent"]
    system: str
    task: str
    max_turns: int
    tools: list[Any] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tools = agent_tools(self.role, sub_agents=self.run.config.sub_agents)
        self.messages = [{"role": "system", "content": self.system}, {"role": "user", "content": self.task}]

    def loop(self) -> tuple[FinishReason, str]:
        """Run until submit, the turn limit, or a stop (time, model error); returns (reason, answer/message)."""
        turns = 0
        while True:
            if turns >= self.max_turns:
                return "max-turns", f"no submit within {self.max_turns} turns"
            try:
                reply = self.run.complete(self.messages, self.tools, self.role)
            except _ContextFull as full:
                if len(self.messages) <= 2:  # nothing left to drop: the task alone does not fit
                    raise _Stop("model-error", str(full)) from full
                self.drop_history()
                continue
            turns += 1
            if self.role == "main":
                self.run.summary.turns = turns
            message = reply.choices[0].message
            self.messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                self.messages.append({"role": "user", "content": NUDGE})
                continue
            for tc in message.tool_calls:
                if tc.type != "function":  # a custom (free-text) tool call: none is offered
                    self.run.summary.tool_errors += 1
                    self.messages.append({"role": "tool", "tool_call_id": tc.id, "content": "error: not a function"})
                    continue
                submitted, text = self.run.tool(tc.function.name, tc.function.arguments, self)
                if submitted:
                    return "submitted", text
                self.messages.append({"role": "tool", "tool_call_id": tc.id, "content": text})
            usage = reply.usage
            if usage is not None and usage.total_tokens > self.run.config.context_budget_tokens:
                self.compact()

    def drop_history(self) -> None:
        """The prompt no longer fits at all (so a summary request would not either): keep the task and the gist
        of the last tool results, drop the rest."""
        recent = [str(m["content"])[-500:] for m in self.messages[-4:] if m.get("role") == "tool"]
        note = "Your earlier context was dropped (it outgrew the model's context). The last tool results ended:\n"
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": f"{self.task}\n\n{note}" + "\n---\n".join(recent)},
        ]
        self.run.summary.compactions += 1

    def compact(self) -> None:
        """Ask the model for a summary of the conversation (role ``<role>-summary``), then go on from the task and
        that summary alone. A summary without text falls back to the last turns' tool results."""
        request = [*self.messages, {"role": "user", "content": SUMMARY_REQUEST}]
        summary_role = "main-summary" if self.role == "main" else "sub-agent-summary"
        try:
            reply = self.run.complete(request, self.tools, summary_role)
        except _ContextFull:  # the summary request itself does not fit
            self.drop_history()
            return
        text = (reply.choices[0].message.content or "").strip()
        if not text:
            recent = [m["content"] for m in self.messages[-4:] if m.get("role") == "tool"]
            text = "Recent tool results:\n" + "\n---\n".join(recent)
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": f"{self.task}\n\nYour earlier context was compacted. Summary so far:\n{text}"},
        ]
        self.run.summary.compactions += 1


class _Episode:
    def __init__(self, config: AgentConfig, toolbox: Toolbox) -> None:
        self.config = config
        self.toolbox = toolbox
        self.summary = AgentSummary()
        self.deadline = time.monotonic() + config.time_limit_s if config.time_limit_s is not None else None
        self.client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=config.max_retries)

    def time_left(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Stop("timeout", f"the time limit of {self.config.time_limit_s:g} s ran out")
        return left

    def complete(self, messages: list[dict[str, Any]], tools: list[Any], role: str) -> Any:
        left = self.time_left()
        extra: dict[str, Any] = {}
        if self.config.max_tokens is not None:
            extra["max_tokens"] = self.config.max_tokens
        if self.config.temperature is not None:
            extra["temperature"] = self.config.temperature
        try:
            reply = self.client.chat.completions.create(
                model=self.config.model,
                messages=messages,  # type: ignore[arg-type]
                tools=tools,
                extra_headers={ROLE_HEADER: role},
                timeout=left if left is not None else openai.NOT_GIVEN,
                **extra,
            )
        except openai.APITimeoutError as exc:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise _Stop("timeout", f"the time limit of {self.config.time_limit_s:g} s ran out") from exc
            raise _Stop("model-error", f"the model endpoint timed out: {exc}") from exc
        except openai.BadRequestError as exc:
            if exc.code == "context_length_exceeded":
                raise _ContextFull(f"the prompt is over the model's context: {exc.message}") from exc
            raise _Stop("model-error", f"the model endpoint answered {exc.status_code}: {exc.message}") from exc
        except openai.APIStatusError as exc:
            raise _Stop("model-error", f"the model endpoint answered {exc.status_code}: {exc.message}") from exc
        except openai.APIError as exc:  # connection refused, reset, a body that is not a completion
            raise _Stop("model-error", f"the model endpoint failed: {type(exc).__name__}: {exc}") from exc
        self.summary.model_calls += 1
        if not getattr(reply, "choices", None):
            raise _Stop("model-error", f"the model endpoint returned no choices: {str(reply)[:200]}")
        return reply

    def tool(self, name: str, raw: str, conv: _Conversation) -> tuple[bool, str]:
        """(submitted, text): the tool's result, or its error as text for the model."""
        self.summary.tool_calls += 1
        try:
            if name == "submit":
                answer = parse_arguments(raw, {}, {"answer": str}).get("answer", "")
                return True, answer
            if name == "spawn_agent" and any(t["function"]["name"] == name for t in conv.tools):
                return False, self.spawn(parse_arguments(raw, {"task": str})["task"])
            if not self.toolbox.handles(name):
                known = ", ".join(t["function"]["name"] for t in conv.tools)
                raise ToolError(f"unknown tool {name!r}; the tools are: {known}")
            return False, self.toolbox.call(name, raw, time_left_s=self.time_left())
        except ToolError as exc:
            self.summary.tool_errors += 1
            return False, f"error: {exc}"

    def spawn(self, task: str) -> str:
        self.summary.sub_agents += 1
        sub = _Conversation(self, "sub-agent", SUB_SYSTEM, task, self.config.sub_agent_max_turns)
        try:
            reason, text = sub.loop()
        except _Stop as stop:
            if stop.reason == "timeout":
                raise
            return f"the sub-agent failed ({stop.reason}): {stop}"
        if reason == "submitted":
            return f"the sub-agent finished: {text}"
        return f"the sub-agent stopped ({reason}): {text}"


def run_agent(config: AgentConfig, task: str) -> AgentSummary:
    """One episode on ``task``; every way it ends is a summary, never an exception."""
    with Toolbox(
        config.workdir,
        command_timeout_s=config.command_timeout_s,
        max_output_chars=config.max_output_chars,
        command_network=config.command_network,
    ) as toolbox:
        episode = _Episode(config, toolbox)
        main = _Conversation(episode, "main", MAIN_SYSTEM, task, config.max_turns)
        try:
            reason, text = main.loop()
        except _Stop as stop:
            reason, text = stop.reason, str(stop)
        finally:
            episode.client.close()
        summary = episode.summary
        summary.finish_reason = reason
        if reason == "submitted":
            summary.answer = text
        else:
            summary.message = text
        return summary
