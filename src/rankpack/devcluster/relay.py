"""The dev cluster's stand-in for kube-proxy, for the one Service pods need: the apiserver.

A pod reaches the apiserver at the ``kubernetes`` Service's address
(``KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT`` = ``10.202.0.1:443``, which the
kubelet puts into every container); on a real cluster kube-proxy routes it to an
apiserver. The dev cluster runs no kube-proxy (no iptables here), so `up` puts the Service
address on ``lo`` (like the node address) and starts this relay as one of its daemons: it
listens on ``10.202.0.1:443`` and copies bytes both ways to ``127.0.0.1:6443``. TLS is end to
end (the apiserver's certificate names ``10.202.0.1``); exec and watch streams are plain
bytes to it. Pods on the bridge reach the address through their gateway (this host).

``python -m rankpack.devcluster.relay LISTEN_HOST:PORT TARGET_HOST:PORT [STATE_DIR]``
(the state directory only marks the process as the dev cluster's, so `down` finds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

BUFFER = 64 * 1024
CONNECT_TIMEOUT_S = 10.0


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {text!r} is not HOST:PORT")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(BUFFER):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _serve_one(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, target: tuple[str, int]
) -> None:
    try:
        upstream_r, upstream_w = await asyncio.wait_for(
            asyncio.open_connection(*target), CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError):
        client_w.close()
        return
    try:
        await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))
    finally:
        for w in (client_w, upstream_w):
            with contextlib.suppress(OSError):
                w.close()


async def start(listen: tuple[str, int], target: tuple[str, int]) -> asyncio.Server:
    """The relay listening on ``listen`` (port 0: any free one), serving until closed."""
    return await asyncio.start_server(
        lambda r, w: _serve_one(r, w, target), listen[0], listen[1], reuse_address=True
    )


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    server = await start(listen, target)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: relay LISTEN_HOST:PORT TARGET_HOST:PORT [STATE_DIR]", file=sys.stderr)
        return 2
    try:
        listen, target = parse_address(argv[0]), parse_address(argv[1])
    except ValueError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(listen, target))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
