"""An engine whose /metrics never ends (or is huge): a scrape of the proxy reads at most 4 MiB
of it, answers with the proxy's own series, and the engine stays in routing."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import SpawnProxy, wait_for

MODELS = b'{"object":"list","data":[{"id":"broken-model","object":"model"}]}'


class EndlessMetricsEngine:
    """/health and /v1/models answer; /metrics streams prefix-cache-looking lines forever."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.metrics_bytes_sent = 0
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while not self.stop.is_set():
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    path = head.split(b" ", 2)[1]
                    if path == b"/metrics":
                        self._endless(conn)
                        return
                    body = MODELS if path == b"/v1/models" else b"{}"
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
                                 + body)

    def _endless(self, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        line = b'vllm:prefix_cache_queries_total{engine="0"} 1.0\n' * 1000
        chunk = f"{len(line):x}\r\n".encode() + line + b"\r\n"
        try:
            while not self.stop.is_set():
                conn.sendall(chunk)
                self.metrics_bytes_sent += len(line)
        except OSError:
            return


@pytest.fixture
def engine() -> Iterator[EndlessMetricsEngine]:
    e = EndlessMetricsEngine()
    yield e
    e.stop.set()
    e.sock.close()


def test_an_endless_engine_metrics_body_is_cut_and_the_scrape_answers(
        spawn_proxy: SpawnProxy, engine: EndlessMetricsEngine) -> None:
    proxy = spawn_proxy([engine.url])
    assert wait_for(lambda: httpx.get(proxy.url + "/ready").status_code == 200, 10, 0.1)
    scrape = httpx.get(proxy.url + "/metrics", timeout=30)
    assert scrape.status_code == 200
    assert "toposerve_upstream_up" in scrape.text  # the proxy's own series
    assert "toposerve_engine_prefix_cache" not in scrape.text  # nothing read whole: nothing shown
    assert engine.metrics_bytes_sent < 64 << 20  # cut near 4 MiB, not at --max-response-bytes
    assert httpx.get(proxy.url + "/ready").status_code == 200  # still in routing
