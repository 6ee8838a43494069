"""The load generator's HTTP client against a real socket server that answers as servers do: keep-alive,
chunked bodies, `Connection: close`, a server that hangs, one that hangs up, and none at all."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable

import pytest

from tandem.loadclient import ConnectionPool, Request, ServerDisconnected

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)


def _run(handler: Handler, client: Callable[[str], Awaitable[None]]) -> None:
    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            await client(f"http://127.0.0.1:{port}")
    asyncio.run(main())


def test_requests_reuse_one_keep_alive_connection_and_read_chunked_bodies() -> None:
    connections: list[int] = []
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while not reader.at_eof():
            try:
                head, body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            seen.append((head, body))
            if len(seen) % 2:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nX-Version: v1\r\n\r\n" + body[:7])
            else:
                writer.write(b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nRetry-After: 1\r\n\r\n"
                             b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
            await writer.drain()
        writer.close()

    async def client(url: str) -> None:
        async with ConnectionPool(url, timeout_s=5.0) as pool:
            first = await pool.request(Request("POST", "/search", b'{"query": "tides"}'))
            second = await pool.request(Request("GET", "/search?query=a+b"))
        assert (first.status, first.body, first.headers["x-version"], first.ok) == (200, b'{"query', "v1", True)
        assert (second.status, second.body, second.headers["retry-after"], second.ok) == (429, b"abcdefg", "1", False)

    _run(handler, client)
    assert len(connections) == 1
    assert seen[0][0].startswith(b"POST /search HTTP/1.1\r\n") and b"Content-Length: 18\r\n" in seen[0][0]
    assert seen[0][1] == b'{"query": "tides"}'
    assert seen[1][0].startswith(b"GET /search?query=a+b HTTP/1.1\r\n") and b"Content-Length" not in seen[1][0]


def test_a_connection_the_server_closes_is_not_reused() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def client(url: str) -> None:
        async with ConnectionPool(url, timeout_s=5.0) as pool:
            for _ in range(3):
                assert (await pool.request(Request("GET", "/"))).body == b"ok"

    _run(handler, client)
    assert len(connections) == 3


def test_a_server_that_hangs_up_or_hangs_is_an_error_not_an_answer() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await _read_request(reader)
        if b"/hang-up" in head:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            await writer.drain()
            writer.close()
        else:
            await asyncio.sleep(5)  # never answers in time

    async def client(url: str) -> None:
        async with ConnectionPool(url, timeout_s=0.3) as pool:
            with pytest.raises(ServerDisconnected):
                await pool.request(Request("GET", "/hang-up"))
            with pytest.raises(TimeoutError):
                await pool.request(Request("GET", "/slow"))

    _run(handler, client)


def test_connections_are_bounded_and_a_request_waits_for_a_free_one() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                break
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    async def client(url: str) -> None:
        async with ConnectionPool(url, timeout_s=5.0, max_connections=2) as pool:
            answers = await asyncio.gather(*(pool.request(Request("GET", "/")) for _ in range(6)))
        assert [a.status for a in answers] == [200] * 6

    _run(handler, client)
    assert len(connections) == 2


def test_no_server_is_an_os_error_and_a_bad_url_is_refused() -> None:
    async def client() -> None:
        async with ConnectionPool("http://127.0.0.1:9", timeout_s=2.0) as pool:
            with pytest.raises(OSError):
                await pool.request(Request("GET", "/"))
    asyncio.run(client())
    with pytest.raises(ValueError, match="plain http"):
        ConnectionPool("https://example.org", timeout_s=1.0)


def test_the_keep_alive_race_sends_a_replayable_request_again_and_only_that() -> None:
    """The server closes an idle keep-alive connection (its keep-alive ended, or it shut down) while the client's
    next request is on its way: the client saw no close when it wrote, and gets a reset or an end of stream with
    no byte of answer. A replayable request goes again on a new connection; any other is an error, and so is a
    new connection closed without an answer. The server runs in a thread of its own, so that the client's loop
    can be held (not reading the close) until the server has closed."""
    closed = threading.Event()
    connections: list[int] = []

    def serve(listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the listener closed: the test is over
                return
            with conn:
                connections.append(1)
                request = conn.recv(65536)
                if b"/hang-up" in request:  # a new connection closed with no answer
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # kept alive ...
                if b"/idle-close" in request:
                    conn.close()  # ... and then closed, idle, as a keep-alive timeout or a shutdown does
                    closed.set()
                    continue
                while conn.recv(65536):  # kept alive until the client closes
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def client(url: str) -> None:
        search = Request("POST", "/search", b"{}", replayable=True)
        async with ConnectionPool(url, timeout_s=10.0) as pool:
            assert (await pool.request(Request("GET", "/idle-close"))).replays == 0
            closed.wait(10)  # the loop held: the client has not seen the close when it writes
            answer = await pool.request(search)
            assert (answer.status, answer.body, answer.replays) == (200, b"ok", 1)
            assert (await pool.request(search)).replays == 0  # the new connection is kept
        closed.clear()
        async with ConnectionPool(url, timeout_s=10.0) as pool:
            await pool.request(Request("GET", "/idle-close"))
            closed.wait(10)
            with pytest.raises(ServerDisconnected):  # not replayable: the caller decides
                await pool.request(Request("POST", "/search", b"{}"))
        async with ConnectionPool(url, timeout_s=10.0) as pool:
            with pytest.raises(ServerDisconnected):  # a new connection: the server may have read it
                await pool.request(Request("POST", "/hang-up", b"{}", replayable=True))

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=serve, args=(listener,), daemon=True)
        thread.start()
        asyncio.run(client(f"http://127.0.0.1:{listener.getsockname()[1]}"))
        listener.shutdown(socket.SHUT_RDWR)
    thread.join(10)
    assert len(connections) == 4  # idle-close and the replay's; idle-close (the refused one's); hang-up
