"""GPU nodes: SGLang engines for rollout, Megatron trainer workers for training, behind the same interface.

Each cell's SGLang server stays up across roles (it was started with ``--enable-memory-saver``): leaving rollout
releases its GPU memory (``POST /release_memory_occupation``, weights and KV cache), coming back resumes it
(``POST /resume_memory_occupation``), loads the newest published weights (``POST /update_weights_from_disk``
with ``weight_version``) and waits for ``GET /health_generate``. That is what makes a switch take seconds,
not minutes. The trainer worker is launched on the cell's nodes from an argv template (``srun`` /
``torchrun`` / ``ssh`` ...), with ``{cell}``, ``{node}``, ``{gpus}``, ``{role}``, ``{scheduler}`` and
``{ready_file}`` filled in; it claims micro-steps from the scheduler like the local worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import httpx

from .._state import CellState
from ._base import Actuator, ActuatorError
from ._drain import Drainer
from ._process import ChildProcesses

__all__ = ["LatestWeights", "SglangMegatronActuator"]

# The newest published weights as (model_path, weight_version), or None to keep what the engine has.
LatestWeights = Callable[[], Awaitable[tuple[str, str] | None]]


class SglangMegatronActuator(Actuator):
    name: ClassVar[str] = "sglang-megatron"

    def __init__(
        self,
        workdir: Path,
        *,
        trainer_argv: Sequence[str],
        scheduler_addr: str,
        drainer: Drainer | None = None,
        latest_weights: LatestWeights | None = None,
        admin_api_key: str | None = None,
        env: Mapping[str, str] | None = None,
        http_timeout_s: float = 120.0,
        ready_timeout_s: float = 600.0,
    ) -> None:
        super().__init__(drainer)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.trainer_argv = list(trainer_argv)
        self.scheduler_addr = scheduler_addr
        self.latest_weights = latest_weights
        self.env = dict(env or {})
        self.ready_timeout_s = ready_timeout_s
        headers = {"Authorization": f"Bearer {admin_api_key}"} if admin_api_key else {}
        self._http = httpx.AsyncClient(timeout=http_timeout_s, headers=headers)
        self.trainers = ChildProcesses("trainer", self.workdir, self.env)

    def _url(self, cell: CellState) -> str:
        if not cell.engine_url:
            raise ActuatorError(f"cell {cell.cell_id} has no engine_url: register it with its SGLang server's URL")
        return cell.engine_url.rstrip("/")

    async def _post(self, url: str, body: dict[str, object]) -> None:
        r = await self._http.post(url, json=body)
        if r.status_code != 200:
            raise ActuatorError(f"POST {url}: {r.status_code} {r.text[:200]}")

    async def release_engine(self, cell: CellState) -> None:
        await self._post(f"{self._url(cell)}/release_memory_occupation", {})

    async def start_engine(self, cell: CellState) -> str | None:
        base = self._url(cell)
        await self._post(f"{base}/resume_memory_occupation", {})
        if self.latest_weights is not None and (latest := await self.latest_weights()) is not None:
            path, version = latest
            await self._post(f"{base}/update_weights_from_disk", {"model_path": path, "weight_version": version})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        while True:
            try:
                if (await self._http.get(f"{base}/health_generate")).status_code == 200:
                    return base
            except httpx.TransportError:
                pass
            if loop.time() > deadline:
                raise ActuatorError(f"{base} did not pass /health_generate in {self.ready_timeout_s:.0f}s")
            await asyncio.sleep(1.0)

    async def start_trainer(self, cell: CellState, *, core: bool) -> None:
        fields = {
            "cell": cell.cell_id, "node": cell.node, "gpus": str(cell.gpus), "role": "core" if core else "satellite",
            "scheduler": self.scheduler_addr,
        }  # fmt: skip
        await self.trainers.start(cell.cell_id, self.trainer_argv, fields, timeout=self.ready_timeout_s)

    async def stop_trainer(self, cell: CellState) -> None:
        await self.trainers.stop(cell.cell_id)

    async def close(self) -> None:
        await self.trainers.close()
        await self._http.aclose()
