"""The API key file is read one way by the launcher and the proxy (a '#' inside a key is part
of it), and an https:// upstream given to the proxy ends in one line, not a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli.apikeys import collect_api_keys
from launcher.errors import LauncherError
from server.config import ConfigError, config_from_args, load_keys
from topocommon.keyfile import parse_keys

REPO = Path(__file__).resolve().parents[2]


def launcher_reads(path: Path) -> list[str]:
    """The keys `launcher serve --api-key-file PATH` hands the proxy."""
    return list(collect_api_keys([], path, {}))


def proxy_reads(path: Path) -> list[str]:
    """The keys the proxy's --api-key-file PATH makes it take."""
    return list(load_keys([], str(path), {}))


def key_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "keys"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def test_a_hash_inside_a_key_is_part_of_the_key_for_both(tmp_path: Path) -> None:
    path = key_file(tmp_path, "# team keys\nsk-a#1\n   # an indented comment\n  sk-b # c  \n\n")
    assert launcher_reads(path) == proxy_reads(path) == ["sk-a#1", "sk-b # c"]


LINES = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
        st.sampled_from(["#", "# note", "  #x", "k#1", " k ", "\t", "##", "a # b"]),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(lines=LINES, ending=st.sampled_from(["\n", "\r\n"]))
def test_the_launcher_and_the_proxy_read_any_key_file_alike(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], ending: str
) -> None:
    path = key_file(tmp_path_factory.mktemp("k"), ending.join(lines))
    try:
        seen_by_launcher: list[str] | str = launcher_reads(path)
    except LauncherError as exc:
        seen_by_launcher = str(exc)
    try:
        seen_by_proxy: list[str] | str = proxy_reads(path)
    except ConfigError as exc:
        seen_by_proxy = str(exc)
    if isinstance(seen_by_launcher, str) and isinstance(seen_by_proxy, list) and any(
            "," in k or "\x00" in k for k in seen_by_proxy):
        # the one difference: the launcher hands its keys on in $TOPOSERVE_API_KEYS, which
        # can hold neither (a comma would split the key), so it refuses them up front
        assert "comma" in seen_by_launcher or "NUL" in seen_by_launcher
    else:
        assert seen_by_launcher == seen_by_proxy
    for key in parse_keys(path.read_text(encoding="utf-8")):
        assert key == key.strip()
        assert key
        assert not key.startswith("#")


def test_a_key_holding_a_comma_is_refused_by_the_launcher_which_would_split_it(
        tmp_path: Path) -> None:
    # the proxy reads the file itself and takes the key whole; the launcher would hand it on in
    # $TOPOSERVE_API_KEYS, where it would become two other keys
    path = key_file(tmp_path, "sk-a,b\n")
    assert proxy_reads(path) == ["sk-a,b"]
    with pytest.raises(LauncherError, match="comma"):
        launcher_reads(path)


def test_an_empty_or_public_key_file_is_refused_alike(tmp_path: Path) -> None:
    empty = key_file(tmp_path, "# no keys yet\n\n")
    with pytest.raises(LauncherError, match="holds no key"):
        launcher_reads(empty)
    with pytest.raises(ConfigError, match="holds no key"):
        proxy_reads(empty)
    public = key_file(tmp_path, "k\n", 0o644)
    with pytest.raises(LauncherError, match="chmod 600"):
        launcher_reads(public)
    with pytest.raises(ConfigError, match="chmod 600"):
        proxy_reads(public)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://127.0.0.1:8001", "plain http://"),
        ("ftp://127.0.0.1:8001", "must be an http:// URL"),
        ("http://", "must be an http:// URL"),
        ("http://127.0.0.1:port", "must be an http:// URL"),
        ("http://[::1", "must be an http:// URL"),  # urlsplit raised ValueError: a traceback
    ],
)
def test_an_upstream_the_proxy_cannot_reach_is_a_config_error(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args(["--upstream", url], {})


def test_python_m_server_with_an_https_upstream_prints_one_line() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "server",
            "--upstream",
            "https://engine.example:8443",
            "--port",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1, res.stderr
    assert "plain http://" in res.stderr
    assert "Traceback" not in res.stderr


@settings(max_examples=300, deadline=None)
@given(rest=st.text(max_size=30), scheme=st.sampled_from(["http://", "https://", ""]))
def test_any_upstream_text_is_a_url_or_a_config_error(scheme: str, rest: str) -> None:
    from urllib.parse import urlsplit

    from server.config import check_upstream

    url = scheme + rest
    accepted = True
    try:
        check_upstream(url)
    except ConfigError:
        accepted = False
    if accepted:  # what the proxy's pools then read from it
        parts = urlsplit(url)
        assert parts.scheme == "http"
        assert parts.hostname


@pytest.mark.parametrize(("args", "says"), [
    (["--port", "70000"], "--port must lie between 0 and 65535"),
    (["--max-in-flight", "0"], "--max-in-flight must be above 0"),
    (["--idle-timeout", "nan"], "--idle-timeout must be above 0 seconds"),
    (["--first-byte-timeout", "inf"], "--first-byte-timeout must be above 0 seconds"),
    (["--max-queue", "-1"], "--max-queue cannot be negative"),
    (["--drain-timeout", "-1"], "--drain-timeout must be 0 or more seconds"),
])
def test_numbers_out_of_range_are_config_errors(args: list[str], says: str) -> None:
    # all of these were taken at start before: the proxy ran with them and printed nothing
    with pytest.raises(ConfigError, match=re.escape(says)):
        config_from_args(["--upstream", "http://127.0.0.1:8001", *args], {})


@pytest.mark.parametrize(("given", "read"), [
    ("http://127.0.0.1:8001/v1", "http://127.0.0.1:8001"),  # an OpenAI client's base URL
    ("http://127.0.0.1:8001/v1/", "http://127.0.0.1:8001"),
    ("http://127.0.0.1:8001/", "http://127.0.0.1:8001"),
])
def test_an_engine_written_as_an_openai_base_url_is_the_engine(given: str, read: str) -> None:
    assert config_from_args(["--upstream", given], {}).upstreams == (read,)


@pytest.mark.parametrize("given", ["http://127.0.0.1:8001/gateway", "http://h:1/?x=1"])
def test_an_engine_url_with_another_path_is_refused_not_ignored(given: str) -> None:
    with pytest.raises(ConfigError, match="a path here would be ignored; give http://"):
        config_from_args(["--upstream", given], {})


def test_the_engines_key_comes_from_the_flag_or_the_environment_and_must_fit_a_header() -> None:
    base = ["--upstream", "http://127.0.0.1:8001"]
    assert config_from_args(base, {}).upstream_api_key is None
    assert config_from_args(base, {"TOPOSERVE_UPSTREAM_API_KEY": "k1"}).upstream_api_key == "k1"
    assert config_from_args([*base, "--upstream-api-key", "k2"],
                            {"TOPOSERVE_UPSTREAM_API_KEY": "k1"}).upstream_api_key == "k2"
    for bad in ("", "has space", "line\r\nx-evil: 1", "kéy"):
        with pytest.raises(ConfigError, match="visible ASCII"):
            config_from_args([*base, "--upstream-api-key", bad], {})


@settings(max_examples=200, deadline=None)
@given(key=st.text(max_size=20))
def test_any_engine_key_is_taken_as_a_header_value_or_refused(key: str) -> None:
    from server.config import upstream_key

    try:
        got = upstream_key(key, {})
    except ConfigError:
        return
    assert got is not None
    assert got.isascii()
    assert got.isprintable()
    assert " " not in got
