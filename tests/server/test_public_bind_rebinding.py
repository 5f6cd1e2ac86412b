"""DNS rebinding against a keyless proxy bound to a public address (``--host 0.0.0.0``): a web
page whose name the attacker re-points at 127.0.0.1 (or at this machine's own network
address) reaches the proxy from this machine's browser with ``Host: attacker.example`` and,
being same-origin to itself, no Origin (a GET) or its own (a POST). The Host check ran only
for a loopback bind, so that page generated and read /v1/models, /ready and /metrics:

  POST /v1/chat/completions HTTP/1.1 / host: attacker.example:PORT /
  origin: http://attacker.example:PORT  -> 200 (the engine's answer)

A request that comes from this machine (the client's address is loopback or the one it
connected to) is now held to names that cannot be a rebinding page's: loopback names, an IP
address (a page's origin is its address then, so the browser connects there, not here), this
machine's host name and --allowed-hosts; other clients are checked as before (the proxy is
reached under names it cannot know). Raw loopback sockets against a real proxy."""

from __future__ import annotations

import json
import socket

import pytest

from tests.server.conftest import SpawnProxy
from tests.server.test_local_guard import CHAT, generations, port_of, raw

REBOUND = ["attacker.example", "rebound.attacker.example", "localhost.attacker.example",
           "127.0.0.1.nip.io"]


@pytest.mark.parametrize("name", REBOUND)
@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/metrics"),
    ("POST", "/v1/messages")])
def test_a_rebinding_page_on_this_machine_is_refused_by_a_public_keyless_proxy(
        spawn_proxy: SpawnProxy, sim_url: str, name: str, method: str, path: str) -> None:
    p = spawn_proxy([sim_url], "--host", "0.0.0.0")
    host = f"{name}:{port_of(p)}"
    headers = [("host", host), ("content-type", "application/json")]
    if method == "POST":
        headers.append(("origin", f"http://{host}"))
    body = json.dumps({**CHAT, "max_tokens": 2}).encode() if method == "POST" else b""
    status, _, answer = raw(p.url, method, path, headers, body)
    assert status == 403, answer
    assert "--allowed-hosts" in json.dumps(answer)
    assert generations(sim_url) == 0


def test_names_a_rebinding_page_cannot_have_are_served_from_this_machine(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--host", "0.0.0.0")
    port = port_of(p)
    for host in [f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", f"192.0.2.7:{port}",
                 f"[2001:db8::7]:{port}", f"{socket.gethostname()}:{port}",
                 socket.gethostname().upper()]:
        status, _, answer = raw(p.url, "GET", "/v1/models", [("host", host)])
        assert status == 200, (host, answer)


def test_allowed_hosts_open_a_name_on_a_public_bind(spawn_proxy: SpawnProxy,
                                                    sim_url: str) -> None:
    p = spawn_proxy([sim_url], "--host", "0.0.0.0", "--allowed-hosts", "gpu-box.example")
    assert raw(p.url, "GET", "/v1/models", [("host", "gpu-box.example:8000")])[0] == 200
    assert raw(p.url, "GET", "/v1/models", [("host", "attacker.example:8000")])[0] == 403
    star = spawn_proxy([sim_url], "--host", "0.0.0.0", "--allowed-hosts", "*")
    assert raw(star.url, "GET", "/v1/models", [("host", "attacker.example:8000")])[0] == 200


def test_a_keyed_public_proxy_still_refuses_a_rebinding_page(spawn_proxy: SpawnProxy,
                                                             sim_url: str) -> None:
    # With a key the page cannot generate, but /ready and /metrics are open to it.
    p = spawn_proxy([sim_url], "--host", "0.0.0.0", "--api-key", "k1")
    assert raw(p.url, "GET", "/ready", [("host", "attacker.example")])[0] == 403
    assert raw(p.url, "GET", "/ready", [("host", "127.0.0.1")])[0] == 200


def own_network_address() -> str | None:
    """This machine's address on its default route (no packet is sent), else None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_a_rebinding_page_reaching_the_machines_network_address_is_refused_too(
        spawn_proxy: SpawnProxy, sim_url: str) -> None:
    address = own_network_address()
    if address is None:
        pytest.skip("no network address besides loopback")
    p = spawn_proxy([sim_url], "--host", "0.0.0.0")
    url = f"http://{address}:{port_of(p)}"
    assert raw(url, "GET", "/v1/models", [("host", "attacker.example")])[0] == 403
    assert raw(url, "GET", "/v1/models", [("host", f"{address}:{port_of(p)}")])[0] == 200
    body = json.dumps({**CHAT, "max_tokens": 2}).encode()
    status, _, _ = raw(url, "POST", "/v1/chat/completions",
                       [("host", "attacker.example"), ("content-type", "application/json")],
                       body)
    assert status == 403
