"""HTTP/1.1 over a raw loopback socket, for tests that must see exactly what is on the wire."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes  # de-chunked

    def json(self) -> Any:
        return json.loads(self.body)


def request_bytes(method: str, path: str, body: bytes | None = None,
                  headers: dict[str, str] | None = None, host: str = "127.0.0.1") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80),
                                    timeout=timeout)


def exchange(url: str, method: str, path: str, obj: Any = None,
             headers: dict[str, str] | None = None, timeout: float = 10.0) -> Answer:
    body = None if obj is None else (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
    with connect(url, timeout) as sock:
        sock.sendall(request_bytes(method, path, body, headers))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return parse(data)


def parse(data: bytes) -> Answer:
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding") == b"chunked":
        rest = dechunk(rest)
    return Answer(status, headers, rest)


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return out
