"""``opengyre bench profiles | fit | run | sweep | roofline | compare``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from opengyre.console import DataDirOpt, NatsUrlOpt, console, fail, log_session, settings_from

__all__ = ["register"]

bench_app = typer.Typer(
    help="AgentPerfBench: agentic workload profiles, saturation sweeps, roofline.", no_args_is_help=True
)

UrlOpt = Annotated[str, typer.Option("--url", help="Server base URL (without /v1), OpenAI-compatible")]
ModelOpt = Annotated[str, typer.Option("--model", help="Model name the server serves")]
ProfileOpt = Annotated[str, typer.Option("--profile", help="Built-in profile name or a profile JSON file")]
OutOpt = Annotated[Path, typer.Option("--out", help="Folder for run.json and requests.csv")]


def _positive_opt(value: float) -> float:
    if not (value > 0.0 and value != float("inf")):
        raise typer.BadParameter(f"{value} is not a positive number")
    return value


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise fail(f"cannot read {what} {path}: {e}") from e
    except ValueError as e:
        raise fail(f"{what} {path} is not valid JSON: {e}") from e


def _profile(spec: str, length_scale: float, turn_scale: float, tool_latency: float | None = None) -> Any:
    from opengyre.bench import PAPER_PROFILES, Profile, ProfileError

    if spec not in PAPER_PROFILES and not Path(spec).exists():
        raise fail(f"unknown profile {spec!r}: neither a built-in ({', '.join(PAPER_PROFILES)}) nor a profile file")
    try:
        prof = PAPER_PROFILES.get(spec) or Profile.from_dict(_load_json(Path(spec), "profile"))
        # stated by the user: constant, and recorded in the profile it reports (as the gRPC tool_latency_s)
        return prof.with_tool_latency(tool_latency).scaled(length_scale, turn_scale)
    except ProfileError as e:
        raise fail(f"profile {spec}: {e}") from e


def _seconds(value: float | None) -> float | None:
    if value is not None and not (0.0 <= value < float("inf")):
        raise typer.BadParameter(f"{value} is not a number of seconds >= 0")
    return value


ToolLatencyOpt = Annotated[
    float | None,
    typer.Option(
        "--tool-latency",
        callback=_seconds,
        help="Seconds between a reply and the session's next request (tool and think time), constant; replaces"
        " the profile's (0: none) [default: the profile's]",
    ),
]


def _tokenizer(path: str | None) -> Any:
    from opengyre.models import load_tokenizer

    return load_tokenizer(path)


@bench_app.command("profiles")
def profiles(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the built-in profiles (the paper's five typical ones) with their derived parameters."""
    from opengyre.bench import PAPER_PROFILES

    if as_json:
        console.print_json(json.dumps({n: p.to_dict() for n, p in PAPER_PROFILES.items()}))
        return
    t = Table(show_edge=False)
    for col in ("name", "mean ISL", "mean OSL", "turns", "first prompt", "observation", "description"):
        t.add_column(col)
    for p in PAPER_PROFILES.values():
        t.add_row(
            p.name,
            f"{p.expected_isl():.0f}",
            f"{p.output.mean:.0f}",
            f"{p.turns.mean:g}",
            f"{p.first_prompt.mean:.0f}",
            f"{p.observation.mean:.0f}",
            p.description,
        )
    console.print(t)
    console.print(f"[dim]{next(iter(PAPER_PROFILES.values())).source}[/]")


@bench_app.command("fit")
def fit(
    trace: Annotated[Path | None, typer.Argument(help="Trace JSON file (ATIF or ShareGPT)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="atif | sharegpt")] = "atif",
    name: Annotated[str, typer.Option("--name")] = "fitted",
    out: Annotated[Path | None, typer.Option("--out", help="Write the profile JSON here")] = None,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="HF tokenizer folder (default: shipped)")] = None,
    from_log: Annotated[bool, typer.Option("--from-log", help="Fit OpenGyre's recorded model calls instead")] = False,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
) -> None:
    """Fit a profile to a trace, or to this deployment's own rollouts (the trajectory store)."""
    from opengyre.bench import ProfileError, calls_sessions, fit_profile, read_trace

    try:
        if from_log:
            sessions = calls_sessions(asyncio.run(_recorded_calls(settings_from(data_dir, nats_url))))
            source = "OpenGyre model-call-recorded events"
            if not sessions:
                raise fail("the event log holds no recorded model call with output")
        else:
            if trace is None:
                raise fail("give a trace file, or --from-log")
            sessions = read_trace(_load_json(trace, "trace"), fmt, _tokenizer(tokenizer))
            source = f"{fmt} trace {trace.name}"
        prof = fit_profile(name, sessions, source)
    except ProfileError as e:
        raise fail(str(e)) from e
    doc = prof.to_dict()
    if out:
        out.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {out}")
    else:
        console.print_json(json.dumps(doc))


async def _recorded_calls(settings: Any) -> list[Any]:
    from opengyre.events import ModelCallRecorded
    from opengyre.trajectory import resolve_calls

    async with log_session(settings) as log:
        calls = [e async for _, e in log.events(ModelCallRecorded)]
        return list(await resolve_calls(log, calls))


def _slo(ttft: float | None, tpot: float | None, e2el: float | None) -> Any:
    from opengyre.bench import Slo

    return Slo(ttft, tpot, e2el) if any(v is not None for v in (ttft, tpot, e2el)) else None


def _publish(settings: Any, event: Any) -> None:
    """Append the run's ``bench-run-completed`` (svc-bench owns it); the results on disk stay whatever happens."""

    async def go() -> int:
        async with log_session(settings) as log:
            await log.ensure_stream()  # a bare nats-server: the stack would have made it
            return (await log.append(event)).seq

    try:
        seq = asyncio.run(go())
    except Exception as e:
        raise fail(f"results written, but publishing bench-run-completed failed: {e}") from e
    console.print(f"published bench-run-completed {event.run_id} at seq {seq}")


@bench_app.command("run")
def run(
    url: UrlOpt,
    model: ModelOpt,
    profile: ProfileOpt = "chat",
    trace: Annotated[
        Path | None, typer.Option("--trace", help="A trace (ShareGPT or ATIF JSON): run it in --form instead")
    ] = None,
    form: Annotated[
        str | None,
        typer.Option(
            "--form",
            help="With --trace: replay (its messages exactly; the default), shadow (its lengths, random tokens) or"
            " synthetic (sessions drawn from the profile fitted to it); a profile is synthetic",
        ),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="Trace format for --trace: sharegpt | atif")] = "sharegpt",
    sessions: Annotated[
        int | None, typer.Option("--sessions", help="Sessions to synthesise (default 16, or the trace's count)")
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c")] = 4,
    rate: Annotated[float | None, typer.Option("--rate", help="Open loop: session arrivals/s (Poisson)")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Client processes")] = 1,
    length_scale: Annotated[float, typer.Option("--length-scale", help="Scale every token length by this")] = 1.0,
    turn_scale: Annotated[float, typer.Option("--turn-scale", help="Scale the turn count by this")] = 1.0,
    tool_latency: ToolLatencyOpt = None,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    slo_ttft: Annotated[float | None, typer.Option("--slo-ttft", help="Goodput SLO on TTFT (s)")] = None,
    slo_tpot: Annotated[float | None, typer.Option("--slo-tpot", help="Goodput SLO on TPOT (s)")] = None,
    slo_e2el: Annotated[float | None, typer.Option("--slo-e2el", help="Goodput SLO on E2EL (s)")] = None,
    out: OutOpt = Path("bench-results"),
    publish: Annotated[bool, typer.Option("--publish", help="Append bench-run-completed to the event log")] = False,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
) -> None:
    """One load run at a fixed concurrency (closed loop) or arrival rate (open loop)."""
    from opengyre.bench import ProfileError, RunSpec, execute_run

    from ._report import completed_event, write_json, write_requests_csv

    tok = _tokenizer(tokenizer)
    if trace is not None and (length_scale != 1.0 or turn_scale != 1.0 or tool_latency is not None):
        raise fail("--length-scale, --turn-scale and --tool-latency change a profile; a trace is sent as recorded")
    spec = RunSpec(
        url,
        model,
        form=form or ("replay" if trace is not None else "synthetic"),
        profile=None if trace is not None else _profile(profile, length_scale, turn_scale, tool_latency),
        trace=_load_json(trace, "trace") if trace is not None else None,
        trace_format=fmt,
        trace_name=trace.name if trace is not None else "",
        sessions=sessions,
        concurrency=concurrency,
        rate=rate,
        workers=workers,
        seed=seed,
        slo=_slo(slo_ttft, slo_tpot, slo_e2el),
    )
    try:
        with console.status(f"{spec.label}: C={concurrency}"):
            result, doc = asyncio.run(execute_run(spec, tok))
    except (ProfileError, ValueError) as e:
        raise fail(str(e)) from e
    summary = doc["summary"]
    write_json(out / "run.json", doc)
    write_requests_csv(out / "requests.csv", result.requests)
    _print_summary(summary)
    if publish:
        _publish(settings_from(data_dir, nats_url), completed_event(None, spec.label, concurrency, url, summary))
    if summary["partial"]:
        # a failed measurement, not bad input: 1, as the CLI's other failed checks
        raise fail(f"partial result: {'; '.join(summary['errors'])}", code=1)


def _print_summary(s: dict[str, Any]) -> None:
    t = Table(show_edge=False)
    for col in ("metric", "mean", "p50", "p90", "p99"):
        t.add_column(col)
    for name in ("ttft_s", "tpot_s", "itl_s", "e2el_s", "queue_s"):
        m = s[name]
        t.add_row(name, *(f"{m[k]:.4f}" if k in m else "-" for k in ("mean", "p50", "p90", "p99")))
    console.print(t)
    console.print(
        f"requests ok {s['requests_ok']} failed {s['requests_failed']}; {s['request_throughput']:.2f} req/s, "
        f"{s['output_token_throughput']:.1f} output tok/s; client loop lag p99 {s['client']['loop_lag_p99_s'] * 1e3:.1f} ms"
        + (" [red](client-bound)[/]" if s["client"]["bottleneck"] else "")
    )


@bench_app.command("sweep")
def sweep_cmd(
    url: UrlOpt,
    model: ModelOpt,
    profile: ProfileOpt = "chat",
    concurrency: Annotated[
        str, typer.Option("--concurrency", help="Increasing list, e.g. 1,2,4,8,16")
    ] = "1,2,4,8,16,32",
    sessions_per_slot: Annotated[int, typer.Option("--sessions-per-slot", min=1)] = 3,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Runs per point before any test")] = 3,
    max_repeats: Annotated[
        int,
        typer.Option(
            "--max-repeats",
            min=1,
            help="Runs per point at most: a step whose gain's 95 % interval straddles --tolerance gets more",
        ),
    ] = 8,  # opengyre.bench._runs.SWEEP_MAX_REPEATS (the service's cap)
    tolerance: Annotated[
        float, typer.Option("--tolerance", callback=_positive_opt, help="Relative gain below which C is saturated")
    ] = 0.05,
    beyond: Annotated[int, typer.Option("--beyond", min=0, help="Points to measure past C* (the collapse)")] = 2,
    workers: Annotated[int, typer.Option("--workers", min=1)] = 1,
    length_scale: Annotated[float, typer.Option("--length-scale", callback=_positive_opt)] = 1.0,
    turn_scale: Annotated[float, typer.Option("--turn-scale", callback=_positive_opt)] = 1.0,
    tool_latency: ToolLatencyOpt = None,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for sweep.json and sweep.png")] = Path("bench-results"),
    publish: Annotated[bool, typer.Option("--publish")] = False,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
) -> None:
    """Closed-loop sweep over concurrency until saturation (C*), then a few points beyond for the collapse.

    Only complete repeats count: a repeat with a failed request is marked and left out, the sweep stops at a
    point where none succeeded, and a sweep with any failed repeat exits 1."""
    from opengyre.bench import sweep_profile

    from ._report import completed_event, plot_sweep, write_json

    try:
        cs = [int(c) for c in concurrency.split(",")]
    except ValueError as e:
        raise fail(f"--concurrency must be integers separated by commas: {e}") from e
    if max_repeats < repeats:
        raise fail(f"--max-repeats ({max_repeats}) must be at least --repeats ({repeats})")
    prof = _profile(profile, length_scale, turn_scale, tool_latency)
    tok = _tokenizer(tokenizer)

    def progress(p: Any) -> None:
        done = ", ".join(f"{x:.2f}" for x in p.throughputs)
        bad = f"; [red]{len(p.failed)} failed repeat(s), excluded[/]" if p.failed else ""
        mean = f"{p.mean:.2f} req/s" if p.throughputs else "no complete repeat"
        console.print(f"C={p.concurrency}: {mean} ({done}){bad}")

    try:
        result = asyncio.run(
            sweep_profile(
                url,
                model,
                prof,
                cs,
                tok,
                sessions_per_slot=sessions_per_slot,
                repeats=repeats,
                max_repeats=max_repeats,
                tolerance=tolerance,
                beyond=beyond,
                workers=workers,
                progress=progress,
            )
        )
    except ValueError as e:  # ProfileError is one
        raise fail(str(e)) from e
    doc = {"profile": prof.to_dict(), "url": url, "model": model, **result.to_dict()}
    write_json(out / "sweep.json", doc)
    plot_sweep(out / "sweep.png", result, f"{prof.name} on {model}")
    console.print(_c_star_line(result))
    if publish and result.c_star is not None and result.stopped is None:
        best = next(p for p in result.points if p.concurrency == result.c_star)
        _publish(
            settings_from(data_dir, nats_url), completed_event(None, prof.name, result.c_star, url, best.summaries[-1])
        )
    if result.stopped is not None:
        raise fail(result.stopped, code=1)
    if result.partial:
        n = sum(len(p.failed) for p in result.points)
        errors = sorted({e for p in result.points for f in p.failed for e in f["errors"]})
        more = f"; and {len(errors) - 1} other error(s), in sweep.json" if len(errors) > 1 else ""
        raise fail(f"partial sweep: {n} failed repeat(s) left out of every figure ({errors[0]}{more})", code=1)


def _c_star_line(result: Any) -> str:
    cs = ", ".join(map(str, result.compatible))
    undecided = f"the tests at up to {result.max_repeats} repeats cannot rule out C in {{{cs}}}"
    if result.c_star is None:
        reached = f"C* not reached up to C={result.curve[-1].concurrency}" if result.curve else "no point measured"
        return reached + (f"; {undecided}" if result.compatible else "")
    how = "decided: every step before it rising, its own flat" if result.decided else undecided
    collapse = "" if result.collapse is None else f"; collapse beyond: {result.collapse:.1%}"
    rises = result.rises_beyond
    warn = f"; [yellow]but throughput surely rises again from C={rises[0]}: not a plateau[/]" if rises else ""
    return f"C* = {result.c_star} ({how}){collapse}{warn}"


def _share(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise typer.BadParameter(f"{value} is not in (0, 1]")
    return value


def _positive(value: float) -> float:
    if not value > 0.0:
        raise typer.BadParameter(f"{value} is not positive")
    return value


@bench_app.command("roofline")
def roofline(
    config: Annotated[Path, typer.Argument(help="A Hugging Face config.json")],
    hardware_name: Annotated[str, typer.Option("--hardware")] = "H100",
    profile: Annotated[str | None, typer.Option("--profile", help="Take ISL/OSL from a built-in profile")] = None,
    isl: Annotated[int, typer.Option("--isl", min=1, help="Input tokens per request")] = 1024,
    osl: Annotated[int, typer.Option("--osl", min=1, help="Output tokens per request")] = 128,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Decode batch")] = 1,
    tp: Annotated[
        int,
        typer.Option(
            "--tp",
            min=1,
            help="Tensor-parallel degree: it must divide the attention heads, and divide the KV heads or be a"
            " multiple of them (each rank then holds a replica of one KV head, as vLLM and SGLang do)",
        ),
    ] = 1,
    mem_util: Annotated[
        float, typer.Option("--mem-util", callback=_share, help="Share of HBM for weights and KV, in (0, 1]")
    ] = 0.9,
    weight_bytes: Annotated[float, typer.Option("--weight-bytes", callback=_positive, help="Bytes per weight")] = 2.0,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for roofline.json and roofline.png")] = None,
) -> None:
    """Analytic roofline (per component and phase) and capacity wall, from a config and a hardware spec."""
    from opengyre.bench import ConfigError, ModelShape, hardware, paper_profile, phase_roofline, roofline_report

    from ._report import plot_roofline, write_json

    try:
        hw = hardware(hardware_name)
        shape = ModelShape.from_config(_load_json(config, "config"), name=config.parent.name or config.stem)
        if profile:
            p = paper_profile(profile)
            isl, osl = round(p.expected_isl()), round(p.output.mean)
        doc = roofline_report(
            shape, hw, isl=isl, osl=osl, batch=batch, tp=tp, memory_utilisation=mem_util, weight_bytes=weight_bytes
        )
    except KeyError as e:  # an unknown hardware or profile name: the message, not KeyError's quoted repr
        raise fail(str(e.args[0])) from e
    except (ConfigError, ValueError) as e:
        raise fail(str(e)) from e
    t = Table(show_edge=False, title=f"{shape.name} on {hw.name} (ridge {hw.ridge:.0f} FLOP/B), ISL {isl}, OSL {osl}")
    for col in ("phase", "component", "GFLOP", "MB", "OI", "bound", "time share"):
        t.add_column(col)
    for ph in ("prefill", "decode"):
        for n, c in doc[ph]["components"].items():
            t.add_row(
                ph,
                n,
                f"{c['flops'] / 1e9:.2f}",
                f"{c['bytes'] / 1e6:.1f}",
                f"{c['oi']:.1f}",
                c["bound"],
                f"{c['time_share']:.1%}",
            )
    console.print(t)
    cap = doc["capacity"]
    console.print(
        f"capacity: {cap['weights_per_gpu_bytes'] / 1e9:.1f} GB weights/GPU, {cap['kv_per_request_per_gpu_bytes'] / 1e9:.3f} GB KV/request "
        f"at {isl + osl} tokens; {cap['max_concurrency']} requests fit, the wall is at C={cap['wall_concurrency']}"
    )
    if out:
        write_json(out / "roofline.json", doc)
        phases = [
            phase_roofline(shape, hw, "prefill", requests=1, new_tokens=isl, context=0),
            phase_roofline(shape, hw, "decode", requests=batch, new_tokens=1, context=isl + osl // 2),
        ]
        plot_roofline(out / "roofline.png", phases, f"{shape.name} on {hw.name}")


@bench_app.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="Folder of the reference run (run.json + requests.csv), e.g. the replay")],
    b: Annotated[Path, typer.Argument(help="Folder of the other run, e.g. the synthetic form")],
    min_per_turn: Annotated[
        int, typer.Option("--min-per-turn", min=1, help="Turn indexes with fewer requests in a run are left out")
    ] = 3,
) -> None:
    """E2EL MAPE of run B against run A: per turn index (the headline), over quantiles, and per request where both
    sent the same requests. Runs of different workloads, servers or load shapes are refused."""
    from opengyre.bench import CompareError, check_comparable, e2el_mape

    from ._report import read_requests_csv

    try:
        docs = [_load_json(d / "run.json", "run") for d in (a, b)]
        check_comparable(docs[0], docs[1])
        res = e2el_mape(read_requests_csv(a / "requests.csv"), read_requests_csv(b / "requests.csv"), min_per_turn)
    except (OSError, CompareError, KeyError) as e:
        raise fail(f"cannot compare: {e}") from e
    console.print_json(json.dumps(res))
    wa, wb = docs[0]["workload"], docs[1]["workload"]
    console.print(
        f"{wb['form']} vs {wa['form']}: E2EL MAPE per turn index {res['per_turn_mape']:.1%} "
        f"(turns {res['turns_compared']}), over quantiles {res['quantile_mape']:.1%}"
        + (f", per request {res['paired_mape']:.1%}" if res["paired_mape"] is not None else "")
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
