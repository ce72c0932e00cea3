"""Record what a real harness sends: a loopback HTTP server that writes each request (headers and JSON body) to
OUT/NNN.json and answers a minimal valid reply in the request's dialect (Anthropic Messages, Responses, Chat
Completions), so the harness goes on to its next call. The first call of a conversation that offers a known
shell tool gets a call of it (``echo hi``); any other call gets text.

    python scripts/capture_harness_requests.py OUT PORT [--agent] [--usage N]

Point the harness at http://127.0.0.1:PORT (tests/proxy/fixtures/harness_requests/README.md has the runs);
``--agent`` makes Claude Code's first call start a sub-agent; ``--usage N`` reports N input tokens per reply, so a
harness that compacts near its context limit sends its compaction request next. Scrub keys before committing.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SHELL: dict[str, dict[str, Any]] = {
    "Bash": {"command": "echo hi"},
    "bash": {"command": "echo hi", "description": "print hi"},
    "exec_command": {"cmd": "echo hi"},
    "shell": {"command": ["bash", "-lc", "echo hi"]},
    "run_shell": {"command": "echo hi"},
}
# Input tokens each reply reports (``--usage``).
USAGE = [10]
AGENT = {"Agent": {"description": "say hi", "prompt": "Run echo hi with Bash.", "subagent_type": "general-purpose"}}


def _tool_names(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for t in body.get("tools") or []:
        if "function" in t:
            out.append(t["function"].get("name"))
        elif t.get("type") == "namespace":
            out += [x.get("name") for x in t.get("tools", [])]
        else:
            out.append(t.get("name"))
    return out


def _pick(body: dict[str, Any], shells: dict[str, dict[str, Any]]) -> str | None:
    sent = json.dumps(body.get("messages") or body.get("input") or [])
    if "tool_result" in sent or "function_call_output" in sent or '"role": "tool"' in sent:
        return None
    names = _tool_names(body)
    return next((k for k in shells if k in names), None)


def _sse(events: list[tuple[str | None, Any]]) -> str:
    return "".join((f"event: {n}\n" if n else "") + f"data: {json.dumps(d)}\n\n" for n, d in events)


def _anthropic(body: dict[str, Any], tool: str | None, shells: dict[str, dict[str, Any]]) -> tuple[Any, str | None]:
    if tool:
        block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": tool}
        block["input"] = shells[tool]
        stop = "tool_use"
    else:
        block, stop = {"type": "text", "text": "Done." if body.get("tools") else "Hello title"}, "end_turn"
    usage = {
        "input_tokens": USAGE[0],
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    msg = {
        "id": f"msg_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        return msg, None
    if block["type"] == "text":
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    else:
        start, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": {**msg, "content": [], "stop_reason": None}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 3}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return None, _sse(events)


def _responses(body: dict[str, Any], tool: str | None, shells: dict[str, dict[str, Any]]) -> tuple[Any, str | None]:
    if tool:
        item: dict[str, Any] = {"type": "function_call", "id": "fc_1", "call_id": f"call_{uuid.uuid4().hex[:8]}"}
        item.update(name=tool, arguments=json.dumps(shells[tool]), status="completed")
    else:
        text = {"type": "output_text", "text": "Done.", "annotations": []}
        item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [text]}
    usage = {
        "input_tokens": USAGE[0],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": USAGE[0] + 3,
    }
    resp = {
        "id": f"resp_{uuid.uuid4().hex[:12]}",
        "object": "response",
        "created_at": time.time(),
        "status": "completed",
        "model": body.get("model"),
        "output": [item],
        "usage": usage,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
    }
    if not body.get("stream"):
        return resp, None
    raw: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**resp, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": resp},
    ]
    return None, _sse([(e["type"], {**e, "sequence_number": i}) for i, e in enumerate(raw)])


def _chat(body: dict[str, Any], tool: str | None, shells: dict[str, dict[str, Any]]) -> tuple[Any, str | None]:
    base = {"id": "chatcmpl-1", "created": int(time.time()), "model": body.get("model")}
    usage = {"prompt_tokens": USAGE[0], "completion_tokens": 3, "total_tokens": USAGE[0] + 3}
    if tool:
        fn = {"name": tool, "arguments": json.dumps(shells[tool])}
        call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": fn}
        msg: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        delta: dict[str, Any] = {"tool_calls": [{"index": 0, **call}]}
        finish = "tool_calls"
    else:
        msg = {"role": "assistant", "content": "Done." if body.get("tools") else "Hello title"}
        delta, finish = {"content": msg["content"]}, "stop"
    if not body.get("stream"):
        choice = {"index": 0, "message": msg, "finish_reason": finish}
        return {**base, "object": "chat.completion", "choices": [choice], "usage": usage}, None
    chunk = {**base, "object": "chat.completion.chunk"}
    frames: list[tuple[str | None, Any]] = [
        (None, {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": delta}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        (None, {**chunk, "choices": [], "usage": usage}),
    ]
    return None, _sse(frames) + "data: [DONE]\n\n"


def serve(out: Path, port: int, shells: dict[str, dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lock, count = threading.Lock(), [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _save(self, body: Any) -> None:
            with lock:
                count[0] += 1
                n = count[0]
            rec = {"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": body}
            (out / f"{n:03d}.json").write_text(json.dumps(rec, indent=1))

        def _send(self, obj: Any, sse: str | None = None, status: int = 200) -> None:
            data = (sse if sse is not None else json.dumps(obj)).encode()
            self.send_response(status)
            self.send_header("content-type", "text/event-stream" if sse is not None else "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._save(None)
            model = {"id": "m", "object": "model", "type": "model", "display_name": "m", "created": 0}
            self._send({"object": "list", "data": [model], "has_more": False})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            self._save(body)
            path = self.path.split("?")[0]
            tool = _pick(body, shells)
            if path.endswith("/count_tokens"):
                self._send({"input_tokens": 10})
            elif path.endswith("/messages"):
                self._send(*_anthropic(body, tool, shells))
            elif path.endswith("/responses"):
                self._send(*_responses(body, tool, shells))
            elif path.endswith("/chat/completions"):
                self._send(*_chat(body, tool, shells))
            else:
                self._send({"error": {"message": f"no route {path}"}}, status=404)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--agent"]
    if "--usage" in args:
        i = args.index("--usage")
        USAGE[0] = int(args[i + 1])
        del args[i : i + 2]
    serve(Path(args[0]), int(args[1]), {**AGENT, **SHELL} if "--agent" in sys.argv else SHELL)
