"""`launcher serve` hands the proxy its local-serving options, closes vLLM's own port with a
per-run key, and tells vLLM where media may come from."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from launcher.cli.main import build_parser
from launcher.engine.extras import NO_REMOTE_MEDIA, EngineExtras, media_protection
from launcher.engine.render import render
from launcher.engine.serve import Runner, Supervision
from launcher.engine.vllmflags import (
    OptionalFlag,
    flags_in_source,
    installed_engine_flags,
    keep_known,
)
from launcher.model.modelspec import load_model_spec
from launcher.planner.plan import Policy, plan
from launcher.probe.topology import Topology
from tests.launcher.paths import model

FLAG_RE = re.compile(r"--[a-z0-9][a-z0-9-]*")
CONSOLE = Console(quiet=True)


def serve_args(*words: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--dry-run", *words])


def spec_for(*words: str) -> Any:
    from launcher.cli.cmd_serve import build_spec

    return build_spec(serve_args("--engine-port", "18999", *words), ())


def test_the_proxy_child_gets_serves_protection_options() -> None:
    spec = spec_for("--allowed-hosts", "box.lan,other", "--allowed-origins",
                    "http://app.example:3000", "--max-connections", "40")
    child = Runner(spec, Supervision(log_dir=Path("/tmp")), console=None)._proxy_child()  # type: ignore[arg-type]
    argv = child.argv
    assert argv[argv.index("--allowed-hosts") + 1] == "box.lan,other"
    assert argv[argv.index("--allowed-origins") + 1] == "http://app.example:3000"
    assert argv[argv.index("--max-connections") + 1] == "40"
    assert "--allow-internal-media" not in argv
    # and the proxy reads them, with the engine key from its environment
    from server.config import config_from_args

    cfg = config_from_args(argv[3:], env=child.env)
    assert cfg.allowed_hosts == ("box.lan", "other")
    assert cfg.allowed_origins == ("http://app.example:3000",)
    assert cfg.max_connections == 40
    assert cfg.upstream_api_key == spec.engine_api_key


def test_vllm_gets_a_per_run_key_and_the_proxy_the_same_one_never_on_a_command_line() -> None:
    first, second = spec_for(), spec_for()
    assert first.engine_api_key
    assert second.engine_api_key
    assert first.engine_api_key != second.engine_api_key
    runner = Runner(first, Supervision(log_dir=Path("/tmp")), CONSOLE)
    engine = runner._engine_child(first.replicas[0])
    proxy = runner._proxy_child()
    assert engine.env["VLLM_API_KEY"] == proxy.env["TOPOSERVE_UPSTREAM_API_KEY"]
    assert engine.env["VLLM_API_KEY"] == first.engine_api_key
    shown = " ".join([*engine.argv, *proxy.argv, *first.summary, repr(first)])
    assert first.engine_api_key not in shown


def test_a_key_from_the_environment_is_used_for_the_engine(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setenv("TOPOSERVE_ENGINE_API_KEY", "mine-123")
    assert spec_for().engine_api_key == "mine-123"


def test_the_users_own_vllm_api_key_is_the_one_the_proxy_sends() -> None:
    # vLLM takes --api-key over VLLM_API_KEY: the proxy must hold that one, or every request 401s
    assert spec_for("--", "--api-key", "given-by-user").engine_api_key == "given-by-user"


def test_vllm_is_limited_to_no_remote_media_and_no_redirects_by_default() -> None:
    engine = spec_for().replicas[0].command
    argv = engine.argv()
    assert argv[argv.index("--allowed-media-domains") + 1] == NO_REMOTE_MEDIA
    assert engine.env["VLLM_MEDIA_URL_ALLOW_REDIRECTS"] == "0"


def test_the_users_media_hosts_replace_the_default() -> None:
    argv = spec_for("--allowed-media-domains", "a.example,b.example").replicas[0].command.argv()
    i = argv.index("--allowed-media-domains")
    assert argv[i + 1:i + 4] == ("a.example", "b.example", "--max-model-len")


def test_allow_internal_media_opens_both_the_proxy_and_vllm() -> None:
    spec = spec_for("--allow-internal-media")
    engine = spec.replicas[0].command
    assert "--allowed-media-domains" not in engine.argv()
    assert "VLLM_MEDIA_URL_ALLOW_REDIRECTS" not in engine.env
    assert "--allow-internal-media" in spec.proxy_args


def test_a_flag_the_installed_vllm_lacks_is_left_out_with_a_note() -> None:
    p = plan(Topology(gpus=()), load_model_spec(model("mistral-7b")), Policy())
    extras = EngineExtras(media_protection((), allow_internal=False).flags, known=frozenset())
    r = render(p, "m", served_name=None, host="127.0.0.1", port=8000, extras=extras)
    assert "--allowed-media-domains" not in r.argv
    assert any(n.startswith("--allowed-media-domains left out: the installed vLLM does not")
               for n in r.notes)


def test_with_no_vllm_to_ask_the_optional_flag_is_left_out() -> None:
    words, notes = keep_known([OptionalFlag(("--allowed-media-domains", "x.invalid"), "why")],
                              None)
    assert words == ()
    assert "no installed vLLM could be read" in notes[0]


def test_the_installed_vllms_flags_are_read_from_its_source() -> None:
    pytest.importorskip("vllm")
    known = installed_engine_flags()
    assert known is not None
    assert {"--allowed-media-domains", "--kv-cache-dtype", "--max-model-len"} <= known


FLAG = st.from_regex(r"--[a-z0-9][a-z0-9-]{0,30}", fullmatch=True)


@given(st.text(), st.lists(FLAG, max_size=5), st.sampled_from(['"', "'"]))
def test_every_quoted_flag_in_a_source_is_found_and_nothing_else(
        noise: str, flags: list[str], quote: str) -> None:
    text = noise + "".join(f"add_argument({quote}{f}{quote}, x)\n" for f in flags)
    found = flags_in_source(text)
    assert set(flags) <= found
    for flag in found:
        assert FLAG_RE.fullmatch(flag)


@pytest.mark.stack
def test_vllms_own_port_refuses_requests_without_the_proxys_key(stack: Any) -> None:
    # A web page that finds the engine's loopback port cannot use it; the proxy still can.
    assert stack.engine_key
    assert httpx.get(stack.vllm_url + "/v1/models", timeout=30).status_code == 401
    assert httpx.get(stack.vllm_url + "/v1/models", headers=stack.engine_headers,
                     timeout=30).status_code == 200
    assert httpx.get(stack.proxy_url + "/v1/models", timeout=30).status_code == 200
    # what the launcher's readiness check reads stays open
    assert httpx.get(stack.vllm_url + "/health", timeout=30).status_code == 200
    # vLLM's SageMaker route generates, and vLLM's own key check leaves it (and /tokenize)
    # open: the launcher's middleware (launcher/engine/vllm_keyguard.py) asks the key there too
    body = {"model": stack.model, "prompt": "def f(", "max_tokens": 1}
    for path, sent in (("/invocations", body), ("/tokenize", {"prompt": "hi"})):
        assert httpx.post(stack.vllm_url + path, json=sent, timeout=60).status_code == 401
    assert httpx.post(stack.vllm_url + "/invocations", json=body, headers=stack.engine_headers,
                      timeout=120).status_code == 200
    assert httpx.post(stack.proxy_url + "/invocations", json=body, timeout=120
                      ).status_code == 200  # the proxy relays it with the key
