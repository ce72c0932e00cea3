"""The gateway alone in a process, recording to a real JetStream log (bench only).

python svc-proxy/bench/proxy_server.py --nats URL --engine URL --port-file /tmp/url [--outbox FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import uuid
from pathlib import Path

from opengyre.eventlog import EventLog, LogConfig
from opengyre.proxy import Gateway, GatewayConfig


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--stream", default="BENCH")
    ap.add_argument("--port-file", type=Path, required=True)
    ap.add_argument("--outbox", help="a durable outbox file (default: in memory)")
    ap.add_argument("--no-fsync", action="store_true", help="commit the outbox without fsync")
    ap.add_argument("--engine-transport", default="http1", choices=("http1", "httpx"), help="the hot path's client")
    args = ap.parse_args()
    log = await EventLog.connect(
        args.nats, LogConfig(stream=args.stream, prefix=f"{args.stream.lower()}.ev", blob_bucket=f"{args.stream}_B")
    )
    gw = Gateway(
        GatewayConfig(
            secret=uuid.UUID(int=7).bytes * 2,
            require_key=False,
            outbox_path=args.outbox,
            outbox_fsync=not args.no_fsync,
            engine_transport=args.engine_transport,
            freeze_startup_heap=True,  # the gateway's own process, as the service's
        ),
        event_log=log,
    )
    await gw.pool.add("e0", args.engine)
    await gw.start()
    args.port_file.write_text(gw.url + "\n")
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await gw.stop()
    await log.close()


if __name__ == "__main__":
    asyncio.run(main())
