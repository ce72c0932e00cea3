"""Each event type has one owner, the service that produces it, declared beside it in the catalogue
(``owner``). This scans the running code's producers — every call that constructs an event — and fails when a
service constructs a type another service owns."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from opengyre import events
from opengyre.events import Event
from opengyre.runtime import SERVICE_CLASSES

ROOT = Path(__file__).resolve().parents[3]
EVENT_TYPES: dict[str, type[Event]] = {
    name: obj
    for name in events.__all__
    if isinstance(obj := getattr(events, name), type) and issubclass(obj, Event) and obj is not Event
}
# Code that plays every service at once and never runs inside one; each says why.
STAND_INS = {
    "svc-scheduler/opengyre/scheduler/sim/": "the simulator replays a policy against a modelled harness and trainer",
}


def _service_of(rel: str) -> str | None:
    """The service a source file runs in (``kernel`` for libs/), None for a stand-in."""
    if any(rel.startswith(s) for s in STAND_INS):
        return None
    top = rel.split("/", 1)[0]
    return top.removeprefix("svc-") if top.startswith("svc-") else "kernel"


def _constructed(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(event class name, line) for each call that constructs a catalogue event, through import aliases too."""
    alias = {name: name for name in EVENT_TYPES}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name in EVENT_TYPES and a.asname:
                    alias[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in alias:
                yield alias[name], node.lineno


def ownership_violations(root: Path) -> list[str]:
    out: list[str] = []
    sources = [
        *root.glob("libs/opengyre/**/*.py"),
        *root.glob("apps/opengyre/**/*.py"),
        *root.glob("svc-*/opengyre/**/*.py"),
    ]
    for path in sorted(sources):
        rel = path.relative_to(root).as_posix()
        service = _service_of(rel)
        if service is None or rel.startswith("libs/opengyre/events/"):
            continue
        for name, line in _constructed(ast.parse(path.read_text(), rel)):
            owner = EVENT_TYPES[name].owner
            if service != owner:
                out.append(f"{rel}:{line}: {service} produces {EVENT_TYPES[name].type_name()}, owned by {owner}")
    return out


def test_every_event_type_declares_one_running_service_as_owner() -> None:
    assert EVENT_TYPES, "no event types found"
    for cls in EVENT_TYPES.values():
        assert cls.owner in SERVICE_CLASSES, f"{cls.__name__}.owner = {cls.owner!r}"


def test_no_service_produces_an_event_type_it_does_not_own() -> None:
    assert ownership_violations(ROOT) == []


def test_a_second_producer_is_caught(tmp_path: Path) -> None:
    mod = tmp_path / "svc-trainer" / "opengyre" / "trainer" / "_rogue.py"
    mod.parent.mkdir(parents=True)
    mod.write_text(
        "from opengyre.events import CellRoleChanged as Moved, ModelCallRecorded\n"
        "from opengyre import events\n"
        "a = Moved(cell_id='c0', from_role='idle', to_role='rollout')\n"
        "b = events.ModelCallRecorded(execution_id='x', call_id='c')\n"
        "c = events.WeightsPublished(run_id='r')  # owned by the trainer: fine\n"
    )
    assert ownership_violations(tmp_path) == [
        "svc-trainer/opengyre/trainer/_rogue.py:3: trainer produces cell-role-changed, owned by scheduler",
        "svc-trainer/opengyre/trainer/_rogue.py:4: trainer produces model-call-recorded, owned by proxy",
    ]
