"""The event catalogue: every type round-trips, tags are unique, envelopes are filled, ids are checked."""

from __future__ import annotations

import msgspec
import pytest

from opengyre.events import (
    Event,
    ExecutionFinished,
    ModelCallRecorded,
    PayloadRef,
    default_registry,
    subject_token,
)
from opengyre.events import _catalogue as catalogue

REQUIRED = {
    "skill-ingested": {"skill_id": "s1", "name": "pdf-tools", "description": "d"},
    "task-synthesized": {"task_id": "t1", "skill_id": "s1"},
    "task-validated": {"task_id": "t1", "ok": True},
    "task-too-easy": {"task_id": "t1", "mean_reward": 0.9, "n_samples": 16},
    "task-hardened": {"task_id": "t1", "from_version": 1, "to_version": 2},
    "execution-dispatched": {"execution_id": "e1", "task_id": "t1", "group_id": "g1"},
    "execution-finished": {"execution_id": "e1", "status": "timed-out", "score": 0.25},
    "model-call-recorded": {
        "execution_id": "e1",
        "call_id": "c1",
        "prompt_delta_ids": [1, 2],
        "output_ids": [3],
        "output_logprobs": [-0.5],
    },
    "payloads-compacted": {"execution_id": "e1", "step": 3, "calls": 2, "bytes": 900},
    "cell-registered": {"cell_id": "cell0"},
    "cell-role-changed": {"cell_id": "cell0", "from_role": "rollout", "to_role": "draining"},
    "cell-engine-changed": {"cell_id": "cell0", "engine_url": "http://engine:30000"},
    "training-step-completed": {"step": 1, "weight_version": "v1", "loss": 0.1, "n_samples": 4, "n_tokens": 100},
    "weights-published": {"weight_version": "v1", "step": 1, "uri": "file:///tmp/ck"},
    "bench-run-completed": {"run_id": "r1", "profile": "coding", "concurrency": 8},
}


def test_the_catalogue_holds_every_event_the_system_needs() -> None:
    assert set(default_registry().types()) == set(REQUIRED)


@pytest.mark.parametrize("type_name", sorted(REQUIRED))
def test_each_event_round_trips_and_has_an_envelope(type_name: str) -> None:
    reg = default_registry()
    cls = reg.types()[type_name]
    event = cls(**REQUIRED[type_name])
    body = reg.encode(event)
    assert msgspec.json.decode(body)["type"] == type_name
    back = reg.decode(type_name, cls.version, body)
    assert back == event
    assert len(event.event_id) == 32 and event.occurred_at.tzinfo is not None
    assert event.aggregate and getattr(event, event.aggregate_key) == event.aggregate_id()


def test_events_are_frozen() -> None:
    e = ExecutionFinished(execution_id="e1", status="completed", score=1.0)
    with pytest.raises(AttributeError):
        e.score = 0.0  # type: ignore[misc]


def test_every_event_class_is_tagged_once() -> None:
    classes = [
        getattr(catalogue, n)
        for n in catalogue.__all__
        if isinstance(getattr(catalogue, n), type) and issubclass(getattr(catalogue, n), Event)
    ]
    tags = [c.type_name() for c in classes]
    assert len(tags) == len(set(tags))


@pytest.mark.parametrize("bad", ["a.b", "a*", ">", "", "a b", "x" * 201])
def test_aggregate_ids_that_would_break_subjects_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="subject token"):
        subject_token(bad)
    with pytest.raises(ValueError):
        ExecutionFinished(execution_id=bad, status="completed").aggregate_id()


def test_model_call_events_carry_deltas_not_prefixes() -> None:
    fields = {f.name for f in msgspec.structs.fields(ModelCallRecorded)}
    assert {"prefix_len", "prompt_delta_ids", "parent_call_id", "output_logprobs", "weight_version"} <= fields
    assert "prompt_ids" not in fields


def test_a_v1_model_call_decodes_as_v2_with_its_tokens_inline() -> None:
    reg = default_registry()
    body = (
        b'{"type":"model-call-recorded","event_id":"0123456789abcdef0123456789abcdef",'
        b'"occurred_at":"2026-11-29T12:00:00Z","execution_id":"e1","call_id":"c1",'
        b'"prompt_delta_ids":[1,2],"output_ids":[3],"output_logprobs":[-0.5]}'
    )
    e = reg.decode("model-call-recorded", 1, body)
    assert ModelCallRecorded.version == 2
    assert isinstance(e, ModelCallRecorded) and e.payload is None
    assert (e.prompt_delta_ids, e.output_ids, e.output_logprobs) == ([1, 2], [3], [-0.5])
    assert (e.n_prompt_delta, e.n_output) == (2, 1)


def test_a_model_call_by_reference_carries_its_lengths() -> None:
    reg = default_registry()
    ref = PayloadRef(digest="ab" * 32, size=40, prompt_delta=7, output=3)
    e = ModelCallRecorded(execution_id="e1", call_id="c1", payload=ref)
    back = reg.decode("model-call-recorded", 2, reg.encode(e))
    assert back == e and (back.n_prompt_delta, back.n_output) == (7, 3) and back.output_ids == []


def test_a_model_call_leaves_out_its_defaults_and_a_body_with_every_field_decodes_the_same() -> None:
    """What logs written before hold (every field, defaults included) and what is written now decode alike."""
    reg = default_registry()
    ref = PayloadRef(digest="ab" * 32, size=40, prompt_delta=7, output=3)
    e = ModelCallRecorded(execution_id="e1", call_id="c1", model="m", payload=ref)
    body = reg.encode(e)
    written = msgspec.json.decode(body)
    assert {"prompt_delta_ids", "parent_call_id", "drift", "context", "attempts", "tool_calls"}.isdisjoint(written)
    assert {"type", "event_id", "occurred_at", "execution_id", "call_id", "model", "payload"} <= set(written)
    every_field = {"type": e.type_name(), **{f: msgspec.to_builtins(getattr(e, f)) for f in e.__struct_fields__}}
    old = msgspec.json.encode(every_field)
    assert len(body) < len(old)
    assert reg.decode("model-call-recorded", 2, old) == reg.decode("model-call-recorded", 2, body) == e
