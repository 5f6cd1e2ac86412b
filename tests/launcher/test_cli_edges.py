"""What a user meets at once on the command line: `launcher plan | head` ends quietly, and the
ready banner's commands work as printed with --api-key, without printing the key."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from launcher.cli.main import EXIT_BROKEN_PIPE, main
from launcher.engine.launchspec import LaunchSpec
from tests.launcher.paths import H200, REPO, model

PLAN = ["plan", "--topology", str(H200), "--model", model("mistral-7b")]


def test_plan_into_a_closed_pipe_exits_quietly() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`head`) is gone before the first line: every write fails
    try:
        res = subprocess.run(
            [sys.executable, "-m", "launcher", *PLAN],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert res.stderr == ""  # no BrokenPipeError traceback, not even the one at exit
    assert res.returncode == EXIT_BROKEN_PIPE


def test_plan_piped_into_head_prints_its_first_lines() -> None:
    res = subprocess.run(
        f"{sys.executable} -m launcher {' '.join(PLAN)} | head -n 1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.stdout.startswith("plan: ")
    assert "Traceback" not in res.stderr


class _Gone:
    """A stdout whose reader has gone."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_broken_pipe_in_process_is_an_exit_code_not_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stdout", _Gone())
    assert main(PLAN) == EXIT_BROKEN_PIPE


# ------------------------------------------------------------------------------- ready banner

SECRET = "sk-team-7f3a#9"


def spec(keys: tuple[str, ...], port: int = 8000) -> LaunchSpec:
    return LaunchSpec(
        model_ref="m",
        served_name="it's-tiny",
        host="127.0.0.1",
        port=port,
        api_keys=keys,
        replicas=(),
        plan_info={},
        summary=(),
    )


def plain(banner: str) -> str:
    return re.sub(r"\[/?(bold|bold green)?\]", "", banner)


def curl_command(banner: str) -> str:
    lines = plain(banner).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("curl "))
    return lines[start].strip().removesuffix("\\") + " " + lines[start + 1].strip()


@pytest.fixture
def openai_stand_in() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Answers /v1/chat/completions, and only with `Authorization: Bearer SECRET`."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"auth": self.headers.get("Authorization"), "body": body})
            ok = self.headers.get("Authorization") == f"Bearer {SECRET}"
            data = b'{"ok": true}' if ok else b'{"error": {"message": "invalid API key"}}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def test_with_keys_the_banner_never_prints_a_key_and_its_curl_works_as_printed(
    openai_stand_in: tuple[int, list[dict[str, Any]]],
) -> None:
    port, seen = openai_stand_in
    banner = spec((SECRET, "second-key"), port).banner()
    assert SECRET not in banner
    assert "second-key" not in banner
    assert "export OPENAI_API_KEY=" in banner
    cmd = curl_command(banner)
    res = subprocess.run(
        ["bash", "-c", f"{cmd} --fail --silent --show-error"],
        env={**os.environ, "OPENAI_API_KEY": SECRET},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert seen[-1] == {
        "auth": f"Bearer {SECRET}",
        "body": {"model": "it's-tiny", "messages": [{"role": "user", "content": "def fib(n):"}]},
    }


def test_the_banners_aider_and_loadgen_lines_read_the_exported_key() -> None:
    text = plain(spec((SECRET,)).banner())
    [aider] = [line for line in text.splitlines() if "aider " in line]
    assert '--openai-api-key "$OPENAI_API_KEY"' in aider
    assert "--openai-api-base http://127.0.0.1:8000/v1" in aider
    [measure] = [line for line in text.splitlines() if "loadgen " in line]
    assert "$OPENAI_API_KEY" in measure  # loadgen reads it (loadgen.cli.api_key_from_env)


def test_without_keys_the_banner_exports_a_placeholder_and_curl_sends_no_header() -> None:
    text = plain(spec(()).banner())
    assert "export OPENAI_API_KEY=sk-unused" in text
    assert "Authorization" not in curl_command(text)


def test_the_banners_json_body_survives_any_served_name() -> None:
    odd = LaunchSpec("m", "a'b\"c $x", "127.0.0.1", 8000, (), (), {}, ())
    cmd = curl_command(odd.banner())
    res = subprocess.run(
        ["bash", "-c", f"printf '%s' {cmd.split(' -d ', 1)[1]}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(res.stdout)["model"] == "a'b\"c $x"
