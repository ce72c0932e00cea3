"""``opengyre scheduler``: the live service's state, its change stream, and operator commands over gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

__all__ = ["scheduler_app"]

scheduler_app = typer.Typer(help="The live elastic scheduler (gRPC).", no_args_is_help=True)
console = Console()
T = TypeVar("T")

AddrOpt = Annotated[str | None, typer.Option("--addr", help="host:port [default: the stack's scheduler]")]


def _addr(addr: str | None) -> str:
    if addr:
        return addr
    from opengyre.config import Settings

    s = Settings.from_env()
    return f"{s.host}:{s.ports['scheduler']}"


def _call(addr: str | None, fn: Callable[[Any], Awaitable[T]]) -> T:
    import grpc

    from opengyre.config import Settings
    from opengyre.runtime import grpc_channel
    from opengyre.v1 import scheduler_pb2_grpc

    token = Settings.from_env().grpc_token()

    async def go() -> T:
        async with grpc_channel(_addr(addr), token) as ch:
            return await fn(scheduler_pb2_grpc.SchedulerServiceStub(ch))

    try:
        return asyncio.run(go())
    except grpc.aio.AioRpcError as exc:
        console.print(f"[bold red]{exc.code().name}:[/] {exc.details()}")
        raise typer.Exit(1) from exc


def _render(view: Any) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[bold]w(t)[/] {view.watermark}", f"[bold]CR(t)[/] {view.rollout_capacity}",
        f"[bold]ready[/] {view.ready_samples} samples / {view.ready_groups} groups",
        f"[bold]trained[/] step {view.trained_step}",
        f"[bold]staleness[/] {view.staleness_mean:.2f} (max {view.staleness_max})",
        f"[bold]policy[/] {view.policy}{' (auto)' if view.auto else ' (advice)'}", f"seq {view.seq}",
    )  # fmt: skip
    cells = Table(title="cells")
    for col in ("#", "cell", "role", "capacity", "gpus", "node", "engine", "resident"):
        cells.add_column(col)
    colors = {"rollout": "blue", "draining": "yellow", "switching": "yellow", "idle": "dim"}
    for c in view.cells:
        color = colors.get(c.role, "red")
        cells.add_row(str(c.order), c.cell_id, f"[{color}]{c.role}[/]", str(c.capacity), str(c.gpus), c.node,
                      c.engine_url or "-", "yes" if c.resident else "")  # fmt: skip
    parts: list[Any] = [head, cells]
    if view.roles or view.dispatch:
        advice = Table(title="policy advice")
        advice.add_column("what")
        advice.add_column("why")
        for r in view.roles:
            advice.add_row(f"{r.cell_id} -> {r.target}", r.reason)
        for d in view.dispatch:
            advice.add_row(f"dispatch {d.groups} group(s) for step {d.step}", "the staleness bound allows it")
        parts.append(advice)
    return Group(*parts)


@scheduler_app.command("state")
def state(addr: AddrOpt = None) -> None:
    """Cells, the watermark, rollout capacity, ready data, staleness and the policy's advice."""
    from opengyre.v1 import scheduler_pb2 as pb

    view = _call(addr, lambda stub: stub.GetState(pb.GetStateRequest()))
    console.print(_render(view))


@scheduler_app.command("watch")
def watch(
    addr: AddrOpt = None, updates: Annotated[int, typer.Option(help="stop after N updates (0: never)")] = 0
) -> None:
    """Follow the state as it changes."""
    from opengyre.v1 import scheduler_pb2 as pb

    async def follow(stub: Any) -> None:
        with Live(console=console, refresh_per_second=4) as live:
            async for view in stub.WatchState(pb.WatchStateRequest(max_updates=updates)):
                live.update(_render(view))

    _call(addr, follow)


@scheduler_app.command("register")
def register_cell(
    cell_id: str,
    capacity: Annotated[int, typer.Option(help="executions the cell holds in rollout")] = 8,
    gpus: Annotated[int, typer.Option()] = 8,
    node: Annotated[str, typer.Option()] = "local",
    engine_url: Annotated[str, typer.Option(help="the cell's rollout engine")] = "",
    idle: Annotated[bool, typer.Option(help="register idle instead of in rollout")] = False,
    resident: Annotated[bool, typer.Option(help="resident rollout pool: never trains")] = False,
    addr: AddrOpt = None,
) -> None:
    """Register a cell."""
    from opengyre.v1 import scheduler_pb2 as pb

    req = pb.RegisterCellRequest(cell_id=cell_id, capacity=capacity, gpus=gpus, node=node, engine_url=engine_url,
                                 role="idle" if idle else "rollout", resident=resident)  # fmt: skip
    c = _call(addr, lambda stub: stub.RegisterCell(req))
    console.print(f"registered [bold]{c.cell_id}[/] ({c.role}, capacity {c.capacity}, order {c.order})")


@scheduler_app.command("force")
def force(
    cell_id: str,
    target: Annotated[str, typer.Argument(help="training or rollout")],
    reason: Annotated[str, typer.Option()] = "operator",
    addr: AddrOpt = None,
) -> None:
    """Move a cell through the whole role-change protocol (refused if the watermark rule forbids it)."""
    from opengyre.v1 import scheduler_pb2 as pb

    out = _call(addr, lambda stub: stub.ForceRole(pb.ForceRoleRequest(cell_id=cell_id, target=target, reason=reason)))
    for s in out.steps:
        console.print(f"  {s}")
    console.print(f"[bold]{out.cell.cell_id}[/] is {out.cell.role}")


@scheduler_app.command("drain")
def drain(cell_id: str, reason: Annotated[str, typer.Option()] = "operator drain", addr: AddrOpt = None) -> None:
    """Take a rollout cell out of service (its executions are rerouted) and park it idle."""
    from opengyre.v1 import scheduler_pb2 as pb

    out = _call(addr, lambda stub: stub.DrainCell(pb.DrainCellRequest(cell_id=cell_id, reason=reason)))
    for s in out.steps:
        console.print(f"  {s}")
    console.print(f"[bold]{out.cell.cell_id}[/] is {out.cell.role}")
