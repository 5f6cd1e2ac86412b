"""Local-serving protections (pure): which requests a proxy serving one machine refuses.

A proxy bound to loopback without API keys (the default) is reachable by every web page its
user visits: a page can POST to ``http://127.0.0.1:8000`` (CSRF: a ``text/plain`` POST needs
no preflight) and, by DNS rebinding its own name to 127.0.0.1, read the answers. Servers for
local models have had exactly this hole (Ollama, llama.cpp, Jupyter closed it the same way):

- ``Host`` is checked while the proxy is bound to loopback (keys or not: a rebinding page
  could still read the open /ready and /metrics): loopback names and addresses (``localhost``,
  ``*.localhost``, ``127.0.0.0/8``, ``[::1]``), the bound address, and ``--allowed-hosts``
  pass, with any port. An empty host (``Host: :8000``, a bypass found in Ollama) is refused;
  a request without Host (HTTP/1.0 tools; HTTP/1.1 without it is refused earlier, by the
  HTTP layer: server.front.lacks_host) is no browser's and passes. Bound elsewhere, the
  proxy is reached under names it cannot know, so Host is checked against an explicit
  ``--allowed-hosts``, or, without one, for clients on this machine alone (a rebinding page
  re-points its name at 127.0.0.1 or at the machine's own network address, and its browser
  runs here): loopback names, any IP address (a page whose origin is an address is reached
  there, not by rebinding) and this machine's host name pass.
- ``Origin`` is checked while no API key is configured (with keys, a cross-site page cannot
  send one: browsers attach no ``Authorization`` on their own and the proxy sets no cookies).
  Absent (curl, SDKs, agents): passes. The proxy's own origin (as the Host names it), a
  loopback origin on any port, a local app's scheme (Ollama's defaults: ``vscode-webview``,
  ``vscode-file``, ``app``, ``tauri``) and ``--allowed-origins`` pass; ``null`` (sandboxed
  frames, ``file:``) and anything unparseable are refused. A request without Origin that a
  browser marks ``Sec-Fetch-Site: cross-site`` (an image or script load from another site's
  page) is refused too, unless it is a navigation (``Sec-Fetch-Mode: navigate``).
- CORS: a page from an origin in ``--allowed-origins`` (``*``: any) gets CORS headers on every
  answer (``Access-Control-Allow-Origin`` its origin, ``Vary: Origin``, ``Retry-After`` and
  ``X-Request-Id`` exposed) and its preflights (``OPTIONS`` with
  ``Access-Control-Request-Method``) are answered 204 before any key is asked (browsers send
  none on a preflight). Every other origin, the loopback ones and the proxy's own included,
  gets no CORS header: a browser then keeps the answer from the page (same-origin pages need
  none), and a keyless proxy still refuses it as above.
- A body sent with a ``Content-Encoding`` (gzip, deflate, br...; ``identity`` is none) is
  refused (415) on every route: the media check below reads the body's bytes as they come,
  and an engine that decodes request codings would fetch what the compressed bytes hid.
- More than one ``Authorization``, ``x-api-key``, ``Host`` or ``Origin`` header is refused
  (400) on every route: which one counts would otherwise depend on the HTTP layer.
- Media URLs in request bodies (every key ``url`` or ``*_url`` with a string value, anywhere:
  ``image_url``, ``video_url``, ``audio_url``, Anthropic's ``source.url``, Responses'
  ``input_image``) that point at this machine or a private network (loopback, private,
  link-local such as 169.254.169.254, shared, reserved and multicast addresses in any
  spelling, ``localhost``, single-label and ``.internal``/``.local`` names) or use ``file:`` or
  an unknown scheme are refused (400) unless ``--allow-internal-media``: the engine would
  fetch them from inside. A public name that resolves inside is for the engine's own
  allow-list (vLLM ``--allowed-media-domains``).

Everything here is a pure function of the request's bytes and the ``GuardPolicy``; the
refusals are ``ProxyError``s, rendered OpenAI- or Anthropic-shaped by the caller.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from server.errors import ProxyError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Schemes of local apps' pages (Ollama's default origins): code already running here.
LOCAL_APP_SCHEMES = frozenset({"vscode-webview", "vscode-file", "app", "tauri"})
# Names that never leave the machine or the local network (RFC 6761, 6762, 8375; cloud
# metadata services answer on ``metadata.google.internal`` and bare ``metadata``).
# Kubernetes' service names (``name.namespace.svc``, resolved by the cluster's search domains) too.
INTERNAL_SUFFIXES = (".localhost", ".internal", ".local", ".localdomain", ".home.arpa", ".lan",
                     ".svc")
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_PORT = re.compile(r"[0-9]{1,5}")
_NUMERIC_HOST = re.compile(r"[0-9a-fx.]+")  # what inet_aton may read as an IPv4 address
SINGLETON_HEADERS = (b"authorization", b"x-api-key", b"host", b"origin")


class Refusal(ProxyError):
    """A request the local-serving protections refuse."""


class HostRefused(Refusal):
    status, type, code = 403, "permission_error", "host_not_allowed"


class OriginRefused(Refusal):
    status, type, code = 403, "permission_error", "cross_site_request"


class AmbiguousHeaders(Refusal):
    status, type, code = 400, "invalid_request_error", "duplicate_header"


class InternalMediaRefused(Refusal):
    status, type, code = 400, "invalid_request_error", "internal_media_url"


class EncodedBody(Refusal):
    status, type, code = 415, "invalid_request_error", "unsupported_content_encoding"


@dataclass(frozen=True)
class GuardPolicy:
    """What is checked, from the proxy's settings (``policy``)."""

    check_host: bool
    check_origin: bool
    bound_host: str = "127.0.0.1"
    port: int = 8000
    allowed_hosts: frozenset[str] = frozenset()  # lower-case names, brackets stripped
    allowed_origins: frozenset[str] = frozenset()  # normalised scheme://host[:port]; "*": any
    allow_internal_media: bool = False
    # Bound elsewhere without --allowed-hosts: Host is checked for clients on this machine
    # alone (``same_machine``: where a rebinding page's browser runs), against the names no
    # such page can have: loopback ones, IP addresses and this machine's own (``own_names``).
    check_local_host: bool = False
    own_names: frozenset[str] = frozenset()


def policy(host: str, port: int, has_keys: bool, allowed_hosts: Sequence[str] = (),
           allowed_origins: Sequence[str] = (), allow_internal_media: bool = False,
           loopback: bool = True, own_names: Sequence[str] = ()) -> GuardPolicy:
    """``own_names``: this machine's host name(s) (socket.gethostname()), served on a public
    bind to clients on this machine."""
    hosts = frozenset(h.strip().lower().strip("[]").rstrip(".") for h in allowed_hosts)
    origins = frozenset("*" if o.strip() == "*" else (normal_origin(o) or "")
                        for o in allowed_origins) - {""}
    check_host = (loopback or bool(hosts)) and "*" not in hosts
    return GuardPolicy(check_host=check_host,
                       check_origin=not has_keys and "*" not in origins,
                       bound_host=host.lower().strip("[]"), port=port,
                       allowed_hosts=hosts, allowed_origins=origins,
                       allow_internal_media=allow_internal_media,
                       check_local_host=not check_host and "*" not in hosts,
                       own_names=frozenset(n.lower().rstrip(".") for n in own_names if n))


# -- request heads --------------------------------------------------------------------------


def check_head(pol: GuardPolicy, headers: Iterable[tuple[bytes, bytes]],
               client: Sequence[Any] | None = None,
               server: Sequence[Any] | None = None) -> Refusal | None:
    """The refusal for a request with these raw headers (names lower-case, as both servers
    give them), or None. ``client`` and ``server``: the connection's two addresses (the ASGI
    scope's), asked only on a public bind (``same_machine``)."""
    host: bytes | None = None
    origin: bytes | None = None
    fetch_site = fetch_mode = b""
    encoding = b""
    seen: set[bytes] = set()
    for name, value in headers:
        if name == b"content-encoding":
            if value.strip().lower() not in (b"", b"identity"):
                encoding = value.strip()
        elif name[:10] == b"sec-fetch-":
            if name == b"sec-fetch-site":
                fetch_site = value.strip().lower()
            elif name == b"sec-fetch-mode":
                fetch_mode = value.strip().lower()
        elif name in SINGLETON_HEADERS:
            if name in seen:
                return AmbiguousHeaders(
                    f"the request has more than one {name.decode()} header; send it once")
            seen.add(name)
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
    if host is not None and (pol.check_host or (
            pol.check_local_host and same_machine(client, server))) and not host_allowed(
            pol, host, local=not pol.check_host):
        return HostRefused(
            "the Host header names neither this machine's loopback (localhost, 127.0.0.1, "
            "[::1]) nor an allowed host, as a web page reaching this proxy by DNS rebinding "
            f"would: connect to http://127.0.0.1:{pol.port}, or start the proxy with "
            "--allowed-hosts NAME for a name of your own")
    if pol.check_origin and (
            (origin is not None and not origin_allowed(pol, origin, host))
            # No Origin, yet a browser says another site's page sent it: a no-cors load (an
            # image, a script, a prefetch) that the Origin check never sees. A user following
            # a link (a navigation) still gets through, as Fetch Metadata's isolation policy has it.
            or (origin is None and fetch_site == b"cross-site" and fetch_mode != b"navigate")):
        return OriginRefused(
            "cross-site request refused: a web page from another origin may not use a proxy "
            "that has no API key; start the proxy with --api-key-file FILE (or "
            "TOPOSERVE_API_KEYS), or allow that page with --allowed-origins ORIGIN")
    if encoding:
        # The body is read as it comes: compressed, the media check above would search
        # compressed bytes, and an engine that decodes it would fetch what it names.
        return EncodedBody(
            f"the request body is sent with Content-Encoding: {encoding.decode('latin-1')}, "
            "which this proxy does not decode (it reads each body to check it); send the "
            "body uncompressed, without a Content-Encoding header")
    return None


def split_host(value: str) -> tuple[str, str] | None:
    """``Host`` (or an authority) as (name, port), the name lower-case without brackets or a
    trailing dot; None when it is not one (empty name, bad port, bare IPv6)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if rest and not (rest[0] == ":" and _PORT.fullmatch(rest[1:])):
            return None
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        return name, rest[1:]
    name, colon, port = value.partition(":")
    if colon and not _PORT.fullmatch(port):
        return None
    name = name.rstrip(".")
    if not name or not _HOST_NAME.fullmatch(name):
        return None
    return name, port


def is_loopback_name(name: str) -> bool:
    """A name or address that can only mean this machine (never a rebinding page's name)."""
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    ip = literal_ip(name)
    return ip is not None and ip.is_loopback


def host_allowed(pol: GuardPolicy, value: bytes, local: bool = False) -> bool:
    """``local``: a client on this machine of a proxy bound elsewhere, which may name the
    machine by any address or by its own name too (never a rebinding page's: an address is
    the page's origin then, so its browser connects there)."""
    parts = split_host(value.decode("latin-1"))
    if parts is None:
        return False
    name = parts[0]
    return (name in pol.allowed_hosts or name == pol.bound_host or is_loopback_name(name)
            or (local and (name in pol.own_names or literal_ip(name) is not None)))


def same_machine(client: Sequence[Any] | None, server: Sequence[Any] | None) -> bool:
    """Whether a connection (the ASGI scope's ``client`` and ``server`` addresses) comes from
    this machine: from a loopback address, or from the very address it reached (a browser
    here reaching the machine's network address). Unknown (a Unix socket): yes."""
    peer = literal_ip(str(client[0])) if client else None
    if peer is None or peer.is_loopback:
        return True
    if not server:
        return False
    return literal_ip(str(server[0])) == peer


def normal_origin(value: str) -> str | None:
    """``scheme://host[:port]`` lower-case with the scheme's default port left out, or None
    when ``value`` is not an origin (``null``, a path, no host)."""
    scheme, sep, rest = value.strip().lower().partition("://")
    if not sep or not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) or "/" in rest.rstrip("/"):
        return None
    parts = split_host(rest.rstrip("/"))
    if parts is None:
        return None
    name, port = parts
    if port and int(port) > 65535:
        return None
    if port and (scheme, int(port)) in (("http", 80), ("https", 443)):
        port = ""
    shown = f"[{name}]" if ":" in name else name
    return f"{scheme}://{shown}" + (f":{int(port)}" if port else "")


def origin_allowed(pol: GuardPolicy, value: bytes, host: bytes | None) -> bool:
    origin = normal_origin(value.decode("latin-1"))
    if origin is None:
        return False
    if origin in pol.allowed_origins:
        return True
    scheme, _, authority = origin.partition("://")
    if scheme in LOCAL_APP_SCHEMES:
        return True
    if scheme not in ("http", "https"):
        return False
    parts = split_host(authority)
    if parts is not None and is_loopback_name(parts[0]):
        return True
    if host is None:
        return False
    own = split_host(host.decode("latin-1"))  # same origin: the page came from this proxy
    return own is not None and parts is not None and own[0] == parts[0] and (
        (own[1] or "80") == (parts[1] or ("443" if scheme == "https" else "80")))


# -- CORS -----------------------------------------------------------------------------------

CORS_METHODS = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
CORS_EXPOSE = b"retry-after, x-request-id"
CORS_MAX_AGE = b"600"  # seconds a browser may keep a preflight's answer
_TOKEN_LIST = re.compile(rb"[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z-]+([ \t]*,[ \t]*"
                         rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+)*[ \t]*")


def cors_origin(pol: GuardPolicy, headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The request's Origin when ``--allowed-origins`` names it (or is ``*``), else None: only
    those pages get CORS headers. Free when no origin is allowed (the default)."""
    if not pol.allowed_origins:
        return None
    origin = next((value for name, value in headers if name == b"origin"), None)
    if origin is None:
        return None
    normal = normal_origin(origin.decode("latin-1"))
    if normal is None or ("*" not in pol.allowed_origins and normal not in pol.allowed_origins):
        return None
    return origin.strip()  # as the browser sent it: it compares the two exactly


def cors_headers(origin: bytes) -> list[tuple[bytes, bytes]]:
    """Added to every answer to a page from an allowed origin."""
    return [(b"access-control-allow-origin", origin), (b"vary", b"origin"),
            (b"access-control-expose-headers", CORS_EXPOSE)]


def preflight(origin: bytes, headers: Iterable[tuple[bytes, bytes]]
              ) -> list[tuple[bytes, bytes]] | None:
    """A preflight's answer headers (status 204), or None when the request is no preflight
    (an OPTIONS without Access-Control-Request-Method). The headers the page asks to send are
    allowed when they are a list of header names; nothing else is echoed back."""
    method = asked = None
    for name, value in headers:
        if name == b"access-control-request-method":
            method = value
        elif name == b"access-control-request-headers":
            asked = value
    if method is None:
        return None
    out = [*cors_headers(origin), (b"access-control-allow-methods", CORS_METHODS),
           (b"access-control-max-age", CORS_MAX_AGE), (b"content-length", b"0")]
    if asked is not None and _TOKEN_LIST.fullmatch(asked):
        out.append((b"access-control-allow-headers", b", ".join(
            t.strip().lower() for t in asked.split(b","))))
    out[1] = (b"vary", b"origin, access-control-request-method, access-control-request-headers")
    return out


# -- media URLs in request bodies -----------------------------------------------------------


def may_name_media(body: bytes) -> bool:
    """Whether ``body`` may hold a ``url`` or ``*_url`` key: its bytes end such a key, it
    escapes characters (a key could be spelled ``"image_\\u0075rl"``), or it holds NULs (JSON
    in UTF-16 or UTF-32, which json.loads, and so vLLM, reads too)."""
    # find, not ``in``: CPython 3.11's ``bytes in bytes`` builds and clears a TypeError per call
    return body.find(b'url"') >= 0 or body.find(b"\\u") >= 0 or body.find(b"\x00") >= 0


def media_refusal(obj: Any) -> Refusal | None:
    """The refusal for the first internal media URL in the parsed body ``obj``, or None."""
    for url in media_urls(obj):
        reason = internal_reason(url)
        if reason is not None:
            return InternalMediaRefused(
                f"a media URL in the request {reason}: the engine would fetch it from inside "
                "this machine's network, so the proxy refuses it; send the image as a data: "
                "URL (base64), or start the proxy with --allow-internal-media")
    return None


def media_urls(obj: Any) -> Iterable[str]:
    """Every string under a ``url`` or ``*_url`` key, at any depth (iteratively: a body
    nested to the parser's limit does not exhaust the stack here)."""
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str):
                    if key == "url" or (isinstance(key, str) and key.endswith("_url")):
                        yield value
                elif isinstance(value, dict | list):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))


def internal_reason(url: str) -> str | None:
    """Why the engine must not fetch ``url`` (words after 'a media URL in the request'), or
    None when it is a data: URL or an http(s) URL naming a public host."""
    text = url.strip()
    scheme = text.partition(":")[0].lower() if ":" in text else ""
    if scheme == "data":
        return None
    if scheme == "file":
        return "reads a local file (file:)"
    if scheme not in ("http", "https"):
        return "is neither an http(s) nor a data: URL"
    if any(ord(c) < 33 or c == "\\" for c in text):
        return "holds spaces, control characters or backslashes, which URL parsers read apart"
    try:
        host = urlsplit(text).hostname
    except ValueError:
        return "has a host that cannot be read"
    if not host:
        return "has no host"
    host = host.rstrip(".")
    ip = literal_ip(host)
    if ip is not None:
        return None if is_public(ip) else "points at a loopback, private or link-local address"
    if not _HOST_NAME.fullmatch(host):
        return "has a host name that is not plain ASCII letters, digits, '-' and '.'"
    if host == "localhost" or "." not in host or host.endswith(INTERNAL_SUFFIXES):
        return "names a local or internal host"
    return None


def literal_ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``name`` as the address a resolver would read it as: IPv6 (mapped IPv4 unwrapped), or
    IPv4 in any form inet_aton takes (``127.1``, ``0x7f000001``, ``2130706433``,
    ``0177.0.0.1``), or None for a name."""
    name = name.strip("[]")
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(name)
    except ValueError:
        if not _NUMERIC_HOST.fullmatch(name):
            return None
        try:
            return ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Globally reachable unicast, including any IPv4 an IPv6 address carries inside. Reserved
    ranges are not: Python counts ::/8 global, and it holds the IPv4-compatible (``::7f00:1``)
    and IPv4-translated (``::ffff:0:7f00:1``) spellings of inside addresses."""
    if not ip.is_global or ip.is_multicast or ip.is_reserved:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        inner = [ip.sixtofour, ip.teredo[1] if ip.teredo else None,
                 ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF) if ip in _NAT64 else None]
        return all(a is None or is_public(a) for a in inner)
    return True


# -- start-up ----------------------------------------------------------------------------------


def exposure_line(host: str, port: int, has_keys: bool, loopback: bool) -> str | None:
    """What a keyless proxy exposes, for its start-up log (None with keys)."""
    if has_keys:
        return None
    who = ("every local user and process" if loopback
           else f"everyone who can reach {host}")
    return (f"no API key: {who} can use http://{host}:{port} — generate with the model, "
            "read /v1/models, /ready and /metrics, and call every relayed vLLM route but the "
            "admin ones (web pages are refused by the Host/Origin checks); to require a key, "
            "start with --api-key-file FILE (mode 600) or set TOPOSERVE_API_KEYS")
