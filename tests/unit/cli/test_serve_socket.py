"""The socket `homeai serve` listens on: connections accepted on it stream without Nagle's algorithm.

With Nagle on, a token written while the client had not yet acknowledged the previous write waited for
that acknowledgement (a client's delayed ACK is 40 ms on Linux): a 2-token reply's first token came 40 ms
after its response headers. asyncio sets ``TCP_NODELAY`` only on sockets that name their protocol."""

from __future__ import annotations

import asyncio
import socket

from homeai.cli.serve_cmd import listening_socket


def test_a_connection_accepted_on_the_serve_socket_has_nagle_off() -> None:
    async def accept_one() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        sock = listening_socket("127.0.0.1", 0)
        server = await asyncio.start_server(on_connect, sock=sock)  # as uvicorn serves the socket it is given
        port = sock.getsockname()[1]
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(seen, timeout=10)
            writer.close()
        return nodelay

    assert asyncio.run(accept_one()) != 0
