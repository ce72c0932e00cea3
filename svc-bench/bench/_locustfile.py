"""Locust's side of ``client_capacity.py --locust``: the same request as every other client there (one user
message, ``max_tokens`` 1, streamed with usage), read to the end of the stream and checked for its content chunk.

Run by Locust from its own throw-away virtual environment (it is not one of the project's dependencies), e.g.
``locust -f _locustfile.py --headless -u 64 -r 64 -t 20s --host http://127.0.0.1:PORT --json``.
"""

from __future__ import annotations

import json

from locust import FastHttpUser, constant, task  # type: ignore[import-not-found]  # Locust's own venv

BODY = json.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
)


class Chat(FastHttpUser):  # type: ignore[misc]  # geventhttpclient: Locust's fastest HTTP user
    wait_time = constant(0)

    @task  # type: ignore[untyped-decorator]
    def chat(self) -> None:
        with self.client.post(
            "/v1/chat/completions", data=BODY, headers={"content-type": "application/json"}, catch_response=True
        ) as resp:
            text = resp.text or ""
            if '"content":"ok"' not in text.replace(" ", "") or "data: [DONE]" not in text:
                resp.failure("no content chunk or no [DONE]")
