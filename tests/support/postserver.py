"""A threaded HTTP server on a loopback port that hands each POST's JSON body to a callback:
the stand-in completions servers of the engine-step tests, which differ only in what they
stream back."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Respond = Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]


class PostServer:
    """Serves every POST by ``respond(handler, body)`` on 127.0.0.1, a port of its own, from
    the moment it is made until :meth:`close`."""

    def __init__(self, respond: Respond) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                respond(self, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
