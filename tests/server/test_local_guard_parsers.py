"""The readers of server.guard, server.conncap and the --upstream credential check, on
generated input: any bytes as Host or Origin, any text as a media URL, any JSON as a body, any
text as --upstream. Never a traceback: always a refusal or an acceptance."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server import guard
from server.config import check_no_credentials, check_upstream, redact_url
from server.conncap import ConnectionCap
from server.errors import ConfigError

KEYLESS = guard.policy("127.0.0.1", 8000, has_keys=False)
KEYED = guard.policy("127.0.0.1", 8000, has_keys=True)
PUBLIC = guard.policy("0.0.0.0", 8000, has_keys=False, loopback=False)

header_bytes = st.binary(max_size=80) | st.text(
    alphabet=st.sampled_from(list("[]:./-_ @#?%0123456789abcdefxlocahstLOCAHST\t")),
    max_size=40).map(lambda s: s.encode())
names = st.sampled_from([b"host", b"origin", b"authorization", b"x-api-key", b"content-type"])


@settings(max_examples=500)
@given(st.lists(st.tuples(names | st.binary(max_size=12), header_bytes), max_size=6))
def test_any_request_head_is_refused_or_accepted(headers: list[tuple[bytes, bytes]]) -> None:
    for pol in (KEYLESS, KEYED, PUBLIC):
        result = guard.check_head(pol, headers)
        assert result is None or isinstance(result, guard.Refusal)
        if result is not None:
            assert result.status in (400, 403)


@settings(max_examples=500)
@given(header_bytes, st.one_of(st.none(), header_bytes))
def test_any_host_and_origin_value_is_read_without_error(host: bytes, origin: bytes | None) -> None:
    assert isinstance(guard.host_allowed(KEYLESS, host), bool)
    if origin is not None:
        assert isinstance(guard.origin_allowed(KEYLESS, origin, host), bool)
        normal = guard.normal_origin(origin.decode("latin-1"))
        assert normal is None or guard.normal_origin(normal) == normal  # a fixed point


@given(st.ip_addresses(), st.integers(0, 65535))
def test_a_host_that_is_an_address_passes_exactly_when_it_is_loopback(
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> None:
    shown = f"[{ip}]" if ip.version == 6 else str(ip)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    expected = ip.is_loopback or bool(mapped and mapped.is_loopback)
    assert guard.host_allowed(KEYLESS, f"{shown}:{port}".encode()) is expected


@pytest.mark.parametrize("host", [b"", b":8000", b"[::1", b"::1", b"localhost:99999x",
                                  b"local host", b"localhost:8000:1", b"attacker.example"])
def test_hosts_that_are_not_loopback_names_are_refused(host: bytes) -> None:
    assert not guard.host_allowed(KEYLESS, host)


def _ipv4_spellings(ip: ipaddress.IPv4Address) -> list[str]:
    n = int(ip)
    a, b, c, d = ip.packed
    return [str(ip), str(n), hex(n), f"{a}.{(b << 16) | (c << 8) | d}",
            f"0{a:o}.{b}.{c}.{d}", f"[::ffff:{ip}]", f"{ip}."]


INSIDE_NETS = [ipaddress.IPv4Network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4")]


def _inside(net: ipaddress.IPv4Network, n: int) -> ipaddress.IPv4Address:
    return net[n % net.num_addresses]


INSIDE_V4 = st.builds(_inside, st.sampled_from(INSIDE_NETS), st.integers(0, 2 ** 32 - 1))


@settings(max_examples=300)
@given(INSIDE_V4, st.sampled_from(["http", "https", "HTTP"]))
def test_an_inside_address_in_any_spelling_is_refused(ip: ipaddress.IPv4Address,
                                                      scheme: str) -> None:
    for host in _ipv4_spellings(ip):
        assert guard.internal_reason(f"{scheme}://{host}/x.png") is not None, host


@settings(max_examples=300)
@given(st.text(max_size=80))
def test_any_text_as_a_media_url_is_refused_or_accepted(url: str) -> None:
    reason = guard.internal_reason(url)
    assert reason is None or isinstance(reason, str)


@given(st.from_regex(r"(https?)://[a-z][a-z0-9-]{0,10}\.(com|org|net|io)(/[a-z]{0,8})?",
                     fullmatch=True))
def test_public_names_pass(url: str) -> None:
    assert guard.internal_reason(url) is None


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=30),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["url", "image_url", "x", "video_url",
                                                       "content", "source"]) | st.text(max_size=5),
                                      inner, max_size=4), max_leaves=30)


@settings(max_examples=300)
@given(JSON)
def test_any_json_body_is_refused_or_accepted(obj: Any) -> None:
    result = guard.media_refusal(obj)
    assert result is None or result.status == 400
    body = json.dumps(obj).encode()
    if result is not None:  # whatever is refused, the byte test let through to the walk
        assert guard.may_name_media(body)


def test_a_body_nested_past_the_recursion_limit_is_walked() -> None:
    obj: Any = {"url": "http://127.0.0.1/"}
    for _ in range(5000):
        obj = [obj]
    assert guard.media_refusal(obj) is not None


# -- credentials in --upstream ---------------------------------------------------------------

secrets = st.text(alphabet="QWXZqwxz!$&'()*+;=", min_size=4, max_size=16)


@given(secrets, st.sampled_from(["http", "https"]), st.sampled_from(["", "user", "u:"]),
       st.sampled_from(["", "/v1", "/x?y=1"]))
def test_a_password_in_upstream_is_refused_and_never_shown(secret: str, scheme: str, user: str,
                                                           tail: str) -> None:
    url = f"{scheme}://{user}{':' if user and not user.endswith(':') else ''}{secret}" \
          f"@127.0.0.1:8001{tail}"
    with pytest.raises(ConfigError) as err:
        check_upstream(url)
    assert secret not in str(err.value)
    assert secret not in redact_url(url)


@settings(max_examples=500)
@given(st.text(max_size=60))
def test_any_upstream_text_is_refused_in_one_line_or_accepted(text: str) -> None:
    for check in (check_no_credentials, check_upstream):
        assert "\n" not in _refusal(check, text)  # the URL is shown with repr: one line
    assert isinstance(redact_url(text), str)


def _refusal(check: Any, text: str) -> str:
    try:
        check(text)
    except ConfigError as exc:
        return str(exc)
    return ""


# -- the connection cap ------------------------------------------------------------------------

class _Transport:
    def __init__(self) -> None:
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


class _Proto:
    def __init__(self, busy: bool) -> None:
        self.busy = busy
        self.transport = _Transport()

    def idle(self) -> bool:
        return not self.busy


@given(st.integers(1, 20), st.lists(st.booleans(), max_size=40))
def test_the_cap_closes_the_longest_silent_idle_connections_and_never_a_busy_one(
        limit: int, busy: list[bool]) -> None:
    protos = [_Proto(b) for b in busy]
    counted: list[str] = []
    cap = ConnectionCap(limit, on_refused=lambda: counted.append("refused"),
                        on_idle_closed=lambda: counted.append("closed"))
    for i, proto in enumerate(protos):  # each spoke last at second i
        cap.active[id(proto.transport)] = float(i)
    admitted = cap.admit(set(protos))
    closed = [p for p in protos if p.transport.closing]
    assert not any(p.busy for p in closed)
    open_after = len(protos) - len(closed)
    if len(protos) < limit:
        assert admitted
        assert not closed
    else:
        assert admitted == (open_after < limit)
        idle = [p for p in protos if not p.busy]
        assert closed == idle[:len(closed)]  # the longest silent first
        assert admitted or len(closed) == len(idle)
    assert counted == ["closed"] * len(closed)  # every close counted (a refusal is the caller's)


class _PrivateOnly:
    """A protocol with the attributes server.front's has, but no public idle()."""

    exchange = None
    buf = b""
    refused = None
    handed_over = False


def test_the_cap_asks_a_protocol_its_public_idle_and_takes_one_without_it_as_busy() -> None:
    from server.conncap import is_idle

    assert is_idle(_Proto(busy=False))
    assert not is_idle(_Proto(busy=True))
    assert not is_idle(_PrivateOnly())  # nothing private is read any more


def test_a_config_built_in_python_refuses_credentials_too() -> None:
    from server.config import ProxyConfig

    with pytest.raises(ConfigError) as err:
        ProxyConfig(upstreams=("http://admin:hunter2@127.0.0.1:8001",))
    assert "hunter2" not in str(err.value)
