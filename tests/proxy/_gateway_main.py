"""The gateway alone in a process, recording through a durable outbox (the crash test SIGKILLs it).

python _gateway_main.py NATS_URL STREAM PREFIX BUCKET ENGINE_URL OUTBOX PORT_FILE [SEAL_EXECUTION]

With SEAL_EXECUTION the execution is sealed (durably) before the port file is written, so a test that sees the
file may SIGKILL the process after the seal and before its calls were flushed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from opengyre.eventlog import EventLog, LogConfig
from opengyre.proxy import Gateway, GatewayConfig


async def main(
    nats: str, stream: str, prefix: str, bucket: str, engine: str, outbox: str, port_file: str, seal: str = ""
) -> None:
    log = await EventLog.connect(nats, LogConfig(stream=stream, prefix=prefix, blob_bucket=bucket), create=False)
    gw = Gateway(GatewayConfig(require_key=False, outbox_path=outbox), event_log=log)
    await gw.pool.add("e0", engine)
    await gw.start()
    if seal:
        await gw.recorder.seal(seal)
    tmp = Path(port_file + ".tmp")
    tmp.write_text(gw.url + "\n")
    tmp.replace(port_file)
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:9]))
