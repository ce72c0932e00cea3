"""Decoding by type and version: upcasting old versions, refusing unknown types and newer versions."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import pytest

from opengyre.events import (
    Event,
    EventRegistry,
    ExecutionFinished,
    InvalidEvent,
    MalformedEvent,
    ModelCallRecorded,
    NewerSchemaVersion,
    NulCharacter,
    PatternUse,
    SkillIngested,
    TaskSynthesized,
    ToolCallPayload,
    UnknownEventType,
    default_registry,
)


class Renamed(Event, frozen=True, kw_only=True, tag="test-renamed"):
    """v2 of a test event: v1 had ``name``; v2 has ``title`` and a new ``rank``."""

    version: ClassVar[int] = 3
    aggregate = "test"
    aggregate_key = "item_id"

    item_id: str
    title: str
    rank: int = 0
    tags: list[str] = msgspec.field(default_factory=list)


def _v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["title"] = out.pop("name")
    return out


def _v2_to_v3(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["tags"] = [t.strip() for t in out.pop("tag_csv", "").split(",") if t.strip()]
    return out


@pytest.fixture
def registry() -> EventRegistry:
    reg = EventRegistry([Renamed])
    reg.register_upcaster("test-renamed", 1, _v1_to_v2)
    reg.register_upcaster("test-renamed", 2, _v2_to_v3)
    return reg


def test_old_versions_are_upcast_step_by_step(registry: EventRegistry) -> None:
    v1 = b'{"type":"test-renamed","event_id":"e","occurred_at":"2026-01-01T00:00:00Z","item_id":"i","name":"old"}'
    got = registry.decode("test-renamed", 1, v1)
    assert isinstance(got, Renamed) and got.title == "old" and got.rank == 0 and got.tags == []
    v2 = b'{"type":"test-renamed","event_id":"e","occurred_at":"2026-01-01T00:00:00Z","item_id":"i","title":"t","tag_csv":"a, b"}'
    got2 = registry.decode("test-renamed", 2, v2)
    assert isinstance(got2, Renamed) and got2.tags == ["a", "b"]


def test_a_missing_upcaster_is_a_malformed_event() -> None:
    reg = EventRegistry([Renamed])
    with pytest.raises(MalformedEvent, match="no upcaster"):
        reg.decode("test-renamed", 1, b'{"item_id":"i","name":"x"}')


def test_unknown_types_and_newer_versions_are_refused_with_reasons() -> None:
    reg = default_registry()
    body = reg.encode(ExecutionFinished(execution_id="e", status="completed"))
    with pytest.raises(UnknownEventType) as unknown:
        reg.decode("execution-exploded", 1, body)
    assert unknown.value.reason == "unknown-type"
    with pytest.raises(NewerSchemaVersion) as newer:
        reg.decode("execution-finished", 2, body)
    assert newer.value.reason == "newer-schema"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"type":"execution-finished","execution_id":"e"}',  # status missing
        b'{"type":"execution-finished","execution_id":"e","status":"exploded"}',  # not a valid status
        b'{"type":"execution-finished","execution_id":7,"status":"completed"}',
    ],
)
def test_malformed_bodies_raise_malformed(body: bytes) -> None:
    with pytest.raises(MalformedEvent) as exc:
        default_registry().decode("execution-finished", 1, body)
    assert exc.value.reason == "malformed"


def test_a_type_cannot_be_registered_twice_by_different_classes() -> None:
    reg = EventRegistry([Renamed])

    class Other(Event, frozen=True, kw_only=True, tag="test-renamed"):
        x: int = 0

    with pytest.raises(ValueError, match="already registered"):
        reg.register(Other)


NUL_EVENTS = [
    SkillIngested(skill_id="s", name="n", description="before\x00after"),
    SkillIngested(skill_id="s", name="n", description="d", metadata={"k": "v\x00"}),
    SkillIngested(skill_id="s", name="n", description="d", metadata={"k\x00": "v"}),
    TaskSynthesized(task_id="t", skill_id="s", patterns=[PatternUse(pattern_id="ok"), PatternUse(pattern_id="p\x00")]),
    ExecutionFinished(execution_id="e", status="completed", detail="exit\x00"),
    ModelCallRecorded(
        execution_id="e",
        call_id="c",
        prompt_delta_ids=[],
        output_ids=[],
        output_logprobs=[],
        tool_calls=[ToolCallPayload(id="t1", name="ls\x00", arguments="{}")],
    ),
]


@pytest.mark.parametrize("event", NUL_EVENTS, ids=lambda e: type(e).__name__)
def test_a_nul_character_anywhere_is_refused_at_encode_and_at_decode(event: Event) -> None:
    """PostgreSQL text cannot hold U+0000 and SQLite can: the schema refuses it so both stores agree."""
    reg = default_registry()
    with pytest.raises(InvalidEvent, match="NUL character"):
        reg.encode(event)
    body = msgspec.json.encode(event)  # what a producer that skips the registry would write
    with pytest.raises(NulCharacter) as exc:
        reg.decode(event.type_name(), 1, body)
    assert exc.value.reason == "nul-character" and isinstance(exc.value, MalformedEvent)
    assert "\x00" not in str(exc.value)  # the message itself must be storable as a dead letter's detail


def test_foreign_bytes_in_opaque_payloads_and_raw_text_are_kept_exactly() -> None:
    """A model may emit byte 0: its output (the context's response, tool-call arguments) is recorded as is."""
    reg = default_registry()
    call = ModelCallRecorded(
        execution_id="e",
        call_id="c",
        prompt_delta_ids=[1],
        output_ids=[0],
        output_logprobs=[-1.0],
        tool_calls=[ToolCallPayload(id="t1", name="run", arguments='{"x": "\x00"}')],
        context={"base": 0, "messages": [{"role": "tool", "content": "bin\x00ary"}], "response": {"content": "\x00"}},
    )
    task = TaskSynthesized(task_id="t", skill_id="s", blueprint={"steps": [{"cmd": ["ls", "a\x00"]}]})
    for event in (call, task):
        assert reg.decode(event.type_name(), 1, reg.encode(event)) == event


def test_an_escaped_backslash_before_u0000_is_text_not_nul() -> None:
    reg = default_registry()
    event = SkillIngested(skill_id="s", name="n", description="C:\\u0000 is a path, not a NUL")
    body = reg.encode(event)
    assert b"\\u0000" in body  # the cheap filter fires; the walk clears it
    assert reg.decode("skill-ingested", 1, body) == event


def test_an_upcaster_that_introduces_a_nul_is_caught(registry: EventRegistry) -> None:
    v1 = b'{"type":"test-renamed","event_id":"e","occurred_at":"2026-01-01T00:00:00Z","item_id":"i","name":"x"}'
    registry.register_upcaster("test-renamed", 2, lambda b: {**b, "tags": ["\x00"]})
    with pytest.raises(NulCharacter, match=r"\.tags\[0\]"):
        registry.decode("test-renamed", 1, v1)
