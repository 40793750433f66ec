"""The dev cluster's relay for the kubernetes Service (kube-proxy's stand-in): bytes both ways,
a closed side closes the other, bad addresses refused. In-process on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest

from rankpack.devcluster import relay


def test_addresses_are_host_and_port() -> None:
    assert relay.parse_address("10.202.0.1:443") == ("10.202.0.1", 443)
    for bad in ("10.202.0.1", ":443", "host:0", "host:99999", "host:https"):
        with pytest.raises(ValueError):
            relay.parse_address(bad)
    assert relay.main(["only-one"]) == 2
    assert relay.main(["a:1", "b"]) == 2


def test_the_relay_copies_both_ways_until_one_side_closes() -> None:
    async def scenario() -> tuple[bytes, bytes]:
        async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            data = await r.read()  # to the end: the client half-closed
            w.write(b"echo:" + data)
            await w.drain()
            w.close()  # the apiserver ends the connection: the client sees the end

        target = await asyncio.start_server(upstream, "127.0.0.1", 0)
        tport = target.sockets[0].getsockname()[1]
        server = await relay.start(("127.0.0.1", 0), ("127.0.0.1", tport))
        rport = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", rport)
        payload = bytes(range(256)) * 1000  # larger than one read of the relay
        writer.write(payload)
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        server.close()
        target.close()
        return payload, answer

    sent, got = asyncio.run(scenario())
    assert got == b"echo:" + sent


def test_an_unreachable_target_closes_the_client_at_once() -> None:
    async def scenario() -> bytes:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()  # nothing listens there any more
        server = await relay.start(("127.0.0.1", 0), ("127.0.0.1", dead))
        rport = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", rport)
        got = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        server.close()
        return got

    assert asyncio.run(scenario()) == b""
