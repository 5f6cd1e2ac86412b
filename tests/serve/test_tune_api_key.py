"""`launcher tune` hands the API key to loadgen through the environment, not its command line
(which every user of the machine sees in `ps`), and loadgen sends it."""

from __future__ import annotations

import argparse
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import cmd_tune
from launcher.engine.launchspec import LaunchSpec
from loadgen.cli import api_key_from_env

SECRET = "sk-tune-5e1"


@pytest.fixture
def server_seeing_keys() -> Iterator[tuple[int, list[str | None]]]:
    """Refuses everything with 401, after noting the Authorization header it was sent."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _refuse(self) -> None:
            seen.append(self.headers.get("Authorization"))
            data = b'{"error": {"message": "no", "type": "invalid_request_error"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _refuse

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def test_tune_gives_loadgen_the_key_in_its_environment_only(
    server_seeing_keys: tuple[int, list[str | None]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port, seen = server_seeing_keys
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    started: list[tuple[list[str], dict[str, str]]] = []
    real_run = subprocess.run

    def recording_run(argv: list[str], **kw: Any) -> Any:
        started.append((list(argv), dict(kw["env"])))
        return real_run(argv, **kw)

    monkeypatch.setattr(cmd_tune.subprocess, "run", recording_run)
    spec = LaunchSpec("m", "m", "127.0.0.1", port, (SECRET,), (), {}, ())
    args = argparse.Namespace(
        requests=1,
        prompt=8,
        gen=4,
        slo_ttft_ms=None,
        slo_tpot_ms=None,
        objective=None,
        workload="interactive",
        concurrency=None,
    )
    cmd_tune.run_loadgen(spec, args, tmp_path / "out.json")
    [(argv, env)] = started
    assert not any(SECRET in a for a in argv)
    assert env["TOPOSERVE_API_KEY"] == SECRET
    assert seen  # loadgen asked the server something
    assert set(seen) == {f"Bearer {SECRET}"}  # with the key it read from its environment


def test_loadgen_takes_its_key_from_the_environment() -> None:
    assert api_key_from_env({"TOPOSERVE_API_KEY": "a", "OPENAI_API_KEY": "b"}) == "a"
    assert api_key_from_env({"OPENAI_API_KEY": "b"}) == "b"
    assert api_key_from_env({"TOPOSERVE_API_KEY": ""}) is None
