#!/usr/bin/env python3
"""A stand-in for the mcpyard binary that relays TCP bytes to the upstream, unchanged.

It takes the same `--config FILE` (the gateway config tests/py/harness.py writes), prints
`listening north <addr>` like mcpyard, relays every connection byte for byte to the `up`
binding's server, and exits 0 on SIGTERM. It is not a gateway: it exists to check the
gateway tests themselves. A transparent relay must pass all of test_gateway_client.py
(nothing there asks more of mcpyard than transparency), and must fail the rows of
test_gateway_faults.py that need a gateway (status mapping, re-initialize, credentials):

    MCPYARD_BIN=tests/py/tools/relay_gateway.py .venv/bin/python -m pytest -q tests/py -m mcpyard

Standard library only.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(host: str, port: int) -> None:
    async def relay(agent_reader: asyncio.StreamReader, agent_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            agent_writer.close()
            return
        await asyncio.gather(pipe(agent_reader, up_writer), pipe(up_reader, agent_writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    print(f"listening north 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


if __name__ == "__main__":
    config = open(sys.argv[sys.argv.index("--config") + 1]).read()
    upstream = re.search(r'server:\s*"?http://([^:/"]+):(\d+)/', config)
    if upstream is None:
        sys.exit(f"relay_gateway: no http upstream in {config!r}")
    asyncio.run(main(upstream.group(1), int(upstream.group(2))))
