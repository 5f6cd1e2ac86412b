"""The HTTP layers issue 25 measured against toposerve's, as proxies for proxy_overhead.py.

    .venv/bin/python benchmarks/proxy_variants.py VARIANT --upstream URL --port P

Variants (each a process in front of one engine, answering GET /ready itself):

- ``uvicorn-front``: toposerve as it is, but every request through uvicorn's (guarded)
  httptools protocol: the lean front (server/front.py) off.
- ``bare-pool``, ``bare-httpx``, ``bare-aiohttp``: plain uvicorn (httptools, uvloop) and a
  bare ASGI app that forwards the request and streams the answer back through ASGI ``send``,
  with no checks, metrics or timeouts; only the engine-side client differs: toposerve's
  (server/upstream.py), httpx (httpcore on h11) or aiohttp. What each client costs, apart
  from everything else the proxy does.

    .venv/bin/python benchmarks/proxy_overhead.py --levels 1,64,256 --prompt-ids 512 \\
        --proxy "uvfront=.venv/bin/python benchmarks/proxy_variants.py uvicorn-front \\
                 --upstream {upstream} --port {port}" --proxy "bare-httpx=..." ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))  # the checkout to measure: the one it is started in

import uvicorn

Scope = dict[str, Any]
App = Any


async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def _httpx(upstream: str) -> App:
    import httpx

    client: httpx.AsyncClient | None = None

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal client
        if client is None:
            client = httpx.AsyncClient(base_url=upstream, timeout=600, limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=1024))
        request = client.build_request(scope["method"], scope["path"], content=await _body(receive),
                                       headers={"content-type": "application/json"})
        resp = await client.send(request, stream=True)
        try:
            await send({"type": "http.response.start", "status": resp.status_code, "headers": [
                (b"content-type", resp.headers.get("content-type", "").encode())]})
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await resp.aclose()
    return app


def _aiohttp(upstream: str) -> App:
    import aiohttp

    session: aiohttp.ClientSession | None = None

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession(upstream, auto_decompress=False,
                                            connector=aiohttp.TCPConnector(limit=0,
                                                                           keepalive_timeout=4))
        async with session.request(scope["method"], scope["path"], data=await _body(receive),
                                   headers={"content-type": "application/json"}) as resp:
            await send({"type": "http.response.start", "status": resp.status, "headers": [
                (b"content-type", resp.headers.get("content-type", "").encode())]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
    return app


def _pool(upstream: str) -> App:
    from server.upstream import Pool

    pool: Pool | None = None

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal pool
        if pool is None:
            pool = Pool(upstream, 5.0)
        resp = await pool.request(scope["method"], scope["path"],
                                  [("content-type", "application/json")], await _body(receive))
        try:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", resp.content_type)]})
            async for chunk in resp.iter_chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            resp.finish()
    return app


def _bare(inner: App, port: int) -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/ready":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await inner(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                lifespan="off", access_log=False, log_level="warning", timeout_keep_alive=75)


def _uvicorn_front(upstream: str, port: int) -> None:
    from server.config import config_from_args
    from server.front import Guards
    from server.serve import uvicorn_config
    from server.uvicorn_adapter import guarded_protocol

    cfg = config_from_args(["--upstream", upstream, "--port", str(port),
                            "--log-level", "warning"])
    guards = Guards(header_timeout_s=cfg.header_timeout_s,
                    max_header_line_bytes=cfg.max_header_line_bytes,
                    max_header_bytes=cfg.max_header_bytes,
                    stall_timeout_s=cfg.client_stall_timeout_s)
    uvicorn.Server(uvicorn_config(cfg, http=guarded_protocol(guards))).run()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant", choices=["uvicorn-front", "bare-pool", "bare-httpx",
                                       "bare-aiohttp"])
    p.add_argument("--upstream", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log-level", default="warning")
    a = p.parse_args()
    if a.variant == "uvicorn-front":
        _uvicorn_front(a.upstream, a.port)
        return
    makers = {"bare-pool": _pool, "bare-httpx": _httpx, "bare-aiohttp": _aiohttp}
    _bare(makers[a.variant](a.upstream), a.port)


if __name__ == "__main__":
    main()
