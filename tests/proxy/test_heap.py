"""The gateway's startup heap is frozen once per process (svc-proxy/opengyre/proxy/_heap.py)."""

from __future__ import annotations

import subprocess
import sys


def test_the_proxys_process_freezes_its_startup_heap_once_and_a_gateway_elsewhere_does_not() -> None:
    # In a process of its own: the freeze is once per process, and this one may have frozen already.
    code = (
        "import asyncio, gc\n"
        "from opengyre.proxy import Gateway, GatewayConfig\n"
        "from opengyre.proxy._heap import freeze_startup_heap\n"
        "async def main():\n"
        "    assert gc.get_freeze_count() == 0\n"
        "    plain = await Gateway(GatewayConfig(require_key=False)).start()\n"
        "    assert gc.get_freeze_count() == 0  # a gateway inside another process leaves its collector alone\n"
        "    await plain.stop()\n"
        "    gw = await Gateway(GatewayConfig(require_key=False, freeze_startup_heap=True)).start()\n"
        "    frozen = gc.get_freeze_count()\n"
        "    assert frozen > 100_000, frozen  # the imports' and the tokenizer's objects\n"
        "    assert gc.get_threshold()[0] == 10_000, gc.get_threshold()\n"
        "    assert not freeze_startup_heap()  # once: a second gateway freezes nothing more\n"
        "    assert gc.get_freeze_count() == frozen\n"
        "    await gw.stop()\n"
        "asyncio.run(main())\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)  # pytest's timeout bounds it
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
