"""The harness-facing dialects (OpenAI chat/completions, Responses, Anthropic): parse requests, format
responses and their SSE streams, error bodies; ``_dialects`` is the table the gateway dispatches through."""

__all__: list[str] = []
