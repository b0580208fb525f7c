"""ConnectionPool: one connection per address, and address_map redirects."""

from __future__ import annotations

import asyncio

import pytest

from metaq.client.config import MetaClientConfig
from metaq.client.pool import ConnectionPool


def test_a_mapped_address_connects_to_its_replacement_and_others_stay() -> None:
    async def scenario() -> None:
        accepted: list[int] = []

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer.get_extra_info("sockname")[1])

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        # 192.0.2.1 (TEST-NET-1) is never reachable: only the redirect can connect.
        pool = ConnectionPool(1.0, {"192.0.2.1:9": f"127.0.0.1:{port}"})
        first = await pool.get("192.0.2.1", 9)
        assert first is await pool.get("192.0.2.1", 9), "one connection per address"
        assert first is await pool.get("127.0.0.1", port), "the redirect and its target share it"
        await asyncio.sleep(0.05)
        assert accepted == [port]
        pool.close_all()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())


@pytest.mark.parametrize("bad", [{"nohost": "127.0.0.1:1"}, {"127.0.0.1:1": "127.0.0.1:http"}])
def test_address_map_entries_must_be_host_port(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="address_map"):
        MetaClientConfig(address_map=bad)
