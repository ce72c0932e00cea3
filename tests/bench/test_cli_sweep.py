"""`opengyre bench sweep` against real HTTP servers that fail, die or are not there, and bad input refused in one
line: what a user sees, and what sweep.json records."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from opengyre.bench import timed_server_thread

from .test_cli import og

TINY = {
    "name": "tiny",
    "first_prompt": {"kind": "constant", "mean": 4},
    "observation": {"kind": "constant", "mean": 1},
    "output": {"kind": "constant", "mean": 3},
    "turns": {"kind": "constant", "mean": 1},
}


def _profile(tmp_path: Path, **changes: object) -> str:
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**TINY, **changes}))
    return str(p)


def _sweep(url: str, profile: str, out: Path, *extra: str) -> tuple[int, str]:
    return og(
        "bench", "sweep", "--url", url, "--model", "timed", "--profile", profile, "--sessions-per-slot", "2",
        "--out", str(out), *extra,
    )  # fmt: skip


def test_an_engine_killed_mid_sweep_is_no_saturation_and_exits_1(tmp_path: Path) -> None:
    # requests 0-7 are C=1's two repeats, 8-15 C=2's (request 9 fails: that repeat is partial), from 16 on
    # C=4's: the engine is killed at the 20th request, so neither C=4 repeat completes
    with timed_server_thread(ttft=0.02, itl=0.005, fail=frozenset({9}), die_after=20) as srv:
        code, out = _sweep(
            srv.url, _profile(tmp_path), tmp_path, "--concurrency", "1,2,4,8", "--repeats", "2", "--max-repeats", "2"
        )
        assert srv.dead
    assert code == 1, out
    assert "no complete repeat at C=4" in out and "the sweep stopped there" in out, out
    assert "C* = 4" not in out and "collapse" not in out and "Traceback" not in out, out
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["partial"] and not doc["saturated"] and doc["c_star"] is None and doc["collapse_beyond_c_star"] is None
    assert [p["concurrency"] for p in doc["points"]] == [1, 2, 4]  # nothing sent past the dead point
    c1, c2, c4 = doc["points"]
    assert len(c1["repeats"]) == 2 and not c1["failed_repeats"]
    assert len(c2["repeats"]) == 1 and len(c2["summaries"]) == 1  # the partial repeat is not averaged in
    [bad] = c2["failed_repeats"]
    assert bad["requests_failed"] == 1 and bad["requests_ok"] == 3 and "HTTP 500" in bad["errors"][0]
    assert c4["repeats"] == [] and len(c4["failed_repeats"]) == 2 and c4["request_throughput_mean"] is None
    assert doc["failed_repeats"] == 3 and (tmp_path / "sweep.png").stat().st_size > 0


def test_a_partial_repeat_alone_makes_the_sweep_exit_1_with_its_figures_from_complete_repeats(tmp_path: Path) -> None:
    with timed_server_thread(ttft=0.02, itl=0.005, fail=frozenset({1})) as srv:
        code, out = _sweep(srv.url, _profile(tmp_path), tmp_path, "--concurrency", "1,2", "--repeats", "2")
    assert code == 1 and "partial sweep: 1 failed repeat(s) left out of every figure (HTTP 500" in out, out
    doc = json.loads((tmp_path / "sweep.json").read_text())
    c1 = doc["points"][0]
    assert doc["partial"] and doc["stopped"] is None and len(c1["failed_repeats"]) == 1
    assert len(c1["repeats"]) >= 1 and all(x > 0 for x in c1["repeats"])


def test_a_sweep_against_an_unreachable_server_stops_at_its_first_point(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused
        code, out = _sweep(f"http://127.0.0.1:{s.getsockname()[1]}", "chat", tmp_path, "--length-scale", "0.02")
    assert code == 1 and "Traceback" not in out, out
    assert "no complete repeat at C=1 (server unreachable at http://127.0.0.1:" in out, out
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["concurrency"] for p in doc["points"]] == [1] and doc["stopped"]
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_a_server_with_two_slots_saturates_at_2_with_the_tests_decided(tmp_path: Path) -> None:
    # two requests served at a time, 100 ms each: ~20 req/s from C = 2 on, half that at C = 1 (long enough that
    # a loaded machine's late wake-ups stay small beside it)
    with timed_server_thread(ttft=0.06, itl=0.02, slots=2) as srv:
        code, out = _sweep(
            srv.url, _profile(tmp_path), tmp_path, "--concurrency", "1,2,4,8", "--repeats", "3",
            "--max-repeats", "6", "--tolerance", "0.25", "--beyond", "1",
        )  # fmt: skip
    assert code == 0, out
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["c_star"] == 2 and doc["c_star_decided"] and doc["c_star_compatible"] == [2], doc["steps"]
    assert [s["verdict"] for s in doc["steps"]][:2] == ["rising", "flat"]
    assert not doc["partial"] and "C* = 2 (decided" in out


def test_bad_input_gets_one_line_and_exit_2(tmp_path: Path) -> None:
    code, out = og("bench", "sweep", "--url", "http://127.0.0.1:9", "--model", "m", "--profile", "chatty")
    assert code == 2 and "unknown profile 'chatty'" in out and "chat, chatbot, coding, terminal, computer-use" in out
    code, out = og("bench", "run", "--url", "http://127.0.0.1:9", "--model", "m", "--profile", "chatty")
    assert code == 2 and "neither a built-in (chat, chatbot" in out, out
    code, out = og(
        "bench",
        "run",
        "--url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--profile",
        _profile(tmp_path, shared_prefix=-50),
    )
    assert code == 2 and "shared_prefix must be a non-negative whole number of tokens, got -50" in out, out
    code, out = og(
        "bench",
        "run",
        "--url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--profile",
        _profile(tmp_path, shared_prefix=2.5),
    )
    assert code == 2 and "shared_prefix must be a whole number, got 2.5" in out, out
    code, out = og(
        "bench", "sweep", "--url", "http://127.0.0.1:9", "--model", "m", "--repeats", "4", "--max-repeats", "2"
    )
    assert code == 2 and "--max-repeats (2) must be at least --repeats (4)" in out, out
    code, out = og("bench", "sweep", "--url", "http://127.0.0.1:9", "--model", "m", "--tolerance", "0")
    assert code == 2 and "--tolerance" in out, out
    for o in (out,):
        assert "Traceback" not in o


def test_run_help_promises_only_what_run_writes() -> None:
    code, out = og("bench", "run", "--help")
    assert code == 0 and "plots" not in out and "run.json and requests.csv" in out, out
    code, out = og("bench", "sweep", "--help")
    assert code == 0 and "sweep.json and sweep.png" in out, out


def _atif(step: dict[str, object]) -> dict[str, object]:
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": "a",
        "steps": [{"source": "user", "message": "fix the bug"}, {"source": "agent", "message": "ok", **step}],
    }


def test_fit_refuses_malformed_atif_fields_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    for step, words in (
        (
            {"metrics": {"completion_tokens": "lots"}},
            "step 2: metrics.completion_tokens must be a positive integer, got 'lots'",
        ),
        ({"metrics": {"completion_tokens": -3}}, "metrics.completion_tokens must be a positive integer, got -3"),
        ({"metrics": "many"}, "step 2: 'metrics' must be an object, got str"),
        ({"observation": {"results": "abc"}}, "step 2: observation.results must be a list of results, got str"),
        ({"observation": ["abc"]}, "step 2: 'observation' must be an object, got list"),
        ({"observation": {"results": [17]}}, "step 2 observation.results[0]: content must be text or a list"),
    ):
        trace.write_text(json.dumps(_atif(step)))
        code, out = og("bench", "fit", str(trace), "--format", "atif")
        assert code == 2 and words in out and "Traceback" not in out, (step, out)
        assert len(out.strip().splitlines()) == 1, out
    # and a well-formed one still fits: results are whole messages, not characters
    trace.write_text(
        json.dumps(_atif({"metrics": {"completion_tokens": 7}, "observation": {"results": [{"content": "abc"}]}}))
    )
    code, out = og("bench", "fit", str(trace), "--format", "atif", "--out", str(tmp_path / "p.json"))
    assert code == 0, out
    assert json.loads((tmp_path / "p.json").read_text())["output"]["mean"] == 7
