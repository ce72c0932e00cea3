"""Chat messages <-> tokens for the served model: render with its chat template, parse what it generated.

Both the proxy (TITO: it renders prompts itself) and the CPU engine's OpenAI routes use this one codec, so a
message list becomes the same tokens wherever it is rendered. Messages are the OpenAI-shaped dicts the chat
template expects (``role``, ``content``, ``tool_calls``, ``tool_call_id``); the Anthropic dialect is converted
to that shape before it gets here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerFast

__all__ = ["ChatCodec", "IncrementalDecoder", "parse_tool_call"]

Message = dict[str, Any]


def parse_tool_call(text: str) -> tuple[str, str] | None:
    """``(name, raw arguments JSON)`` of a ``{"name": ..., "arguments": {...}}`` body, or None if malformed."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    args = obj["arguments"]
    if isinstance(args, str):
        return obj["name"], args
    # Keep the model's own bytes for the arguments: find the value's span instead of dumping it again.
    dec = json.JSONDecoder()
    key = text.find('"arguments"')
    while key != -1:
        colon = text.find(":", key + len('"arguments"'))
        if colon == -1:
            break
        start = colon + 1
        while start < len(text) and text[start] in " \t\r\n":
            start += 1
        try:
            value, end = dec.raw_decode(text, start)
        except ValueError:
            key = text.find('"arguments"', key + 1)
            continue
        if value == args:
            return obj["name"], text[start:end]
        key = text.find('"arguments"', key + 1)
    return obj["name"], json.dumps(args)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a byte-level BPE token uses for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTE_DECODER = _byte_decoder()


class ChatCodec:
    """Tokenizer + chat template of one served model."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast) -> None:
        self.tokenizer = tokenizer
        # The hot path skips the HF wrappers (their per-call checks cost more than the work here): the Rust
        # tokenizer directly, and the chat template compiled once, rendered with what apply_chat_template passes.
        self._backend = tokenizer.backend_tokenizer
        self._template: Any = None
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            self._template = _compile_jinja_template(tokenizer.chat_template)
        except (ImportError, AttributeError, TypeError):  # another transformers: use the public API
            self._template = None
        self._template_vars = dict(tokenizer.special_tokens_map)
        eos = tokenizer.eos_token_id
        if not isinstance(eos, int):
            raise ValueError("the tokenizer has no eos token")
        self.eos_id: int = eos
        self.eos_text: str = str(tokenizer.eos_token)
        self.special_ids: frozenset[int] = frozenset(int(i) for i in tokenizer.all_special_ids)
        self.tool_start = self._special("<tool_call>")
        self.tool_end = self._special("</tool_call>")
        self.turn_close_text = self._turn_close_after_eos()
        self.turn_close_ids = self.encode(self.turn_close_text)
        self.context_limit = int(getattr(tokenizer, "model_max_length", 0) or 0)

    def _special(self, text: str) -> int | None:
        tid = self.tokenizer.convert_tokens_to_ids(text)
        return tid if isinstance(tid, int) and tid != self.tokenizer.unk_token_id else None

    def _turn_close_after_eos(self) -> str:
        """What the template writes after the eos that ends an assistant turn (``"\\n"`` for ChatML)."""
        marker = "\x00opengyre-marker\x00"
        text = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}], gen=False)
        tail = text[text.index(marker) + len(marker) :]
        at = tail.find(self.eos_text)
        return tail[at + len(self.eos_text) :] if at != -1 else ""

    # --- rendering ----------------------------------------------------------------------------------

    def render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None, *, gen: bool) -> str:
        if self._template is not None:
            return str(
                self._template.render(
                    messages=list(messages),
                    tools=list(tools) if tools else None,
                    documents=None,
                    add_generation_prompt=gen,
                    **self._template_vars,
                )
            )
        out = self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, add_generation_prompt=gen, tokenize=False
        )
        return str(out)

    def encode(self, text: str) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def render_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The prompt for the next assistant turn, tokenized from scratch."""
        return self.encode(self.render(messages, tools, gen=True))

    def reply_ids(
        self, history: Sequence[Message], reply: Message, tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """The ids of assistant ``reply`` after ``history`` as the model emits them: its text as the template
        writes it (content, ``<tool_call>`` tags), tokenized on its own after the generation prompt, then eos.

        On its own because that is how a generated reply is tokenized: the engine produced it after the prompt's
        last token, and a BPE merge across that boundary (or the next turn's) never happened. SFT targets come
        from here, so the model learns exactly the ids it will emit behind the proxy.
        """
        before = self.render(history, tools, gen=True)
        after = self.render([*history, reply], tools, gen=False)
        close = self.eos_text + self.turn_close_text
        if not after.startswith(before) or not after.endswith(close) or len(after) < len(before) + len(close):
            raise ValueError(
                "the chat template does not write this assistant turn as generation prompt + reply + "
                f"{close!r}: its ids cannot be told apart from the prompt's"
            )
        return [*self.encode(after[len(before) : len(after) - len(close)]), self.eos_id]

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special))

    def token_bytes(self, tid: int) -> bytes:
        """The bytes one token stands for (a byte-level token may be part of a character: not text alone)."""
        text = self.decode([tid], skip_special=False)
        if "\ufffd" not in text or tid in self.special_ids:
            return text.encode()
        piece = self._backend.id_to_token(tid) or ""
        if piece and all(ch in _BYTE_DECODER for ch in piece):
            return bytes(_BYTE_DECODER[ch] for ch in piece)
        return text.encode()


class IncrementalDecoder:
    """Text of a growing id sequence, emitted piecewise without splitting multi-byte characters."""

    def __init__(self, codec: ChatCodec, *, skip_special: bool = True) -> None:
        self._codec = codec
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        prefix_text = self._codec.decode(self._ids[self._prefix : self._read], skip_special=self._skip)
        new_text = self._codec.decode(self._ids[self._prefix :], skip_special=self._skip)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix = self._read
            self._read = len(self._ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Whatever is left (an incomplete character becomes U+FFFD)."""
        prefix_text = self._codec.decode(self._ids[self._prefix : self._read], skip_special=self._skip)
        new_text = self._codec.decode(self._ids[self._prefix :], skip_special=self._skip)
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]
