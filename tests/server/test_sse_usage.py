"""The SSE inspector against streams in every spelling an engine may write: what the client
receives (the engine's bytes, less only what the proxy itself asked for) and what is counted."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from server.sse import SseInspector, usage_options
from simengine.shapes import Answer, Templates


def stream_bytes(answer: Answer) -> bytes:
    tpl = Templates(answer)
    n = answer.n_tokens
    return tpl.first + b"".join(tpl.token(k) for k in range(n - 1)) + tpl.last(n - 1)


def events(data: bytes) -> list[bytes]:
    return [e for e in data.split(b"\n\n") if e]


def payloads(data: bytes) -> list[dict[str, object]]:
    return [json.loads(e[6:]) for e in events(data) if e != b"data: [DONE]"]


def feed_all(inspector: SseInspector, reads: list[bytes]) -> tuple[bytes, int, object]:
    forwarded, tokens, usage = b"", 0, None
    for read in reads:
        scan = inspector.feed(read)
        assert not scan.malformed
        forwarded += scan.forward
        tokens += scan.tokens
        usage = scan.usage or usage
    return forwarded, tokens, usage


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


answers = st.builds(
    Answer, kind=st.sampled_from(["chat", "completion"]), model=st.just("m"),
    n_tokens=st.integers(1, 6), prompt_tokens=st.integers(0, 50),
    finish_reason=st.sampled_from(["length", "stop"]), include_usage=st.just(True),
    continuous_usage=st.booleans(), spaced=st.booleans(),
    fingerprint=st.one_of(st.none(), st.just("fp_3")))


@settings(max_examples=300, deadline=None)
@given(answer=answers, cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_client_that_asked_for_usage_gets_the_engine_bytes_and_counts_are_right(
        answer: Answer, cuts: list[int]) -> None:
    data = stream_bytes(answer)
    forwarded, tokens, usage = feed_all(SseInspector(strip_usage=False), split(data, cuts))
    assert forwarded == data
    assert tokens == answer.n_tokens
    assert usage == (answer.prompt_tokens, answer.n_tokens)


@settings(max_examples=300, deadline=None)
@given(answer=answers, cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_client_that_did_not_ask_gets_what_the_engine_would_have_sent_it(
        answer: Answer, cuts: list[int]) -> None:
    # What the proxy sends vLLM on the client's behalf: include_usage, and continuous usage
    # dropped (vLLM ignores it without include_usage); the client must receive exactly the
    # stream of a request without usage, and the counters still get the usage chunk.
    asked = Answer(**{**answer.__dict__, "continuous_usage": False})
    without = Answer(**{**asked.__dict__, "include_usage": False})
    data = stream_bytes(asked)
    forwarded, tokens, usage = feed_all(SseInspector(strip_usage=True), split(data, cuts))
    assert payloads(forwarded) == [{**p, "id": payloads(forwarded)[0]["id"],
                                    "created": payloads(forwarded)[0]["created"]}
                                   for p in payloads(stream_bytes(without))]
    assert all(p["choices"] for p in payloads(forwarded))
    assert forwarded.endswith(b"data: [DONE]\n\n")
    assert tokens == answer.n_tokens
    assert usage == (answer.prompt_tokens, answer.n_tokens)


def test_stripping_keeps_every_other_byte_of_the_engine() -> None:
    answer = Answer(kind="chat", model="m", n_tokens=2, prompt_tokens=4, finish_reason="stop",
                    include_usage=True, spaced=True, fingerprint="fp_9")
    data = stream_bytes(answer)
    forwarded, _, _ = feed_all(SseInspector(strip_usage=True), [data])
    sent = events(data)
    assert events(forwarded)[:-2] == sent[:-3]  # role and tokens unchanged
    last = events(forwarded)[-2]
    assert last.startswith(sent[-3][:-1])  # the choice's last chunk, with the fingerprint added
    assert json.loads(last[6:])["system_fingerprint"] == "fp_9"


def test_a_stream_broken_after_the_last_chunk_still_gives_the_client_that_chunk() -> None:
    answer = Answer(kind="chat", model="m", n_tokens=2, prompt_tokens=1, finish_reason="stop",
                    include_usage=True)
    data = stream_bytes(answer)
    cut = data.index(b'"choices":[]')
    inspector = SseInspector(strip_usage=True)
    forwarded, _, _ = feed_all(inspector, [data[:cut]])
    held = inspector.release()
    assert b'"finish_reason":"stop"' in held
    assert b'"finish_reason":"stop"' not in forwarded


@pytest.mark.parametrize("spaced", [False, True])
def test_plain_token_shortcut_agrees_with_feed(spaced: bool) -> None:
    for kind in ("chat", "completion"):
        for include_usage, continuous in ((False, False), (True, False), (True, True)):
            answer = Answer(kind=kind, model="m", n_tokens=3, prompt_tokens=1,
                            finish_reason="length", include_usage=include_usage,
                            continuous_usage=continuous, spaced=spaced, fingerprint="f")
            for strip in (False, True):
                for event in events(stream_bytes(answer)):
                    data = event + b"\n\n"
                    if SseInspector(strip).plain_token(data):
                        scan = SseInspector(strip).feed(data)
                        assert (scan.forward, scan.tokens, scan.usage) == (data, 1, None)


def _plain_on_bytes(data: bytes, keep_last: bool) -> bool:
    """plain_token's tests as they were written on the bytes (before they ran on the text),
    and no CR: feed rewrites CR line endings to LF, so such an event is not forwarded as is."""
    return (data[-3:] == b"}\n\n" and data[:7] == b"data: {" and b"\n\n" not in data[:-2]
            and b"\r" not in data
            and b"usage" not in data and b'"role"' not in data and data[7:14] != b'"error"'
            and (keep_last or b'"finish_reason":null' in data or b"finish_reason" not in data))


_PIECES = st.sampled_from([b"data: {", b"}\n\n", b"\n\n", b"usage", b'"role"', b'"error"',
                           b"finish_reason", b'"finish_reason":null', b"\r", b"\xff\xfe", b"x"])


@settings(max_examples=400)
@given(parts=st.lists(st.one_of(_PIECES, st.binary(max_size=8)), max_size=8),
       strip=st.booleans())
@example(parts=[b"data: {", b"\r", b"}\n\n"], strip=False)  # CI's clean clone found it
def test_plain_token_on_the_text_is_the_same_test_as_on_the_bytes(
        parts: list[bytes], strip: bool) -> None:
    data = b"".join(parts)
    inspector = SseInspector(strip)
    assert inspector.plain_token(data) == _plain_on_bytes(data, not strip)
    if inspector.plain_token(data):
        scan = SseInspector(strip).feed(data)
        assert (scan.forward, scan.tokens, scan.usage, scan.malformed) == (data, 1, None, False)


@pytest.mark.parametrize(("event", "tokens"), [
    (b'data:{"choices":[{"index":0,"delta":{"content":"x"}}]}', 1),  # no space after data:
    (b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}', 0),
    (b'data: {"choices":[{"index":0,"delta":{"content":"usage"}}]}', 1),
    (b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}', 1),
])
def test_events_are_told_apart_by_what_they_say(event: bytes, tokens: int) -> None:
    scan = SseInspector(strip_usage=True).feed(event + b"\n\n")
    assert (scan.tokens, scan.usage, scan.malformed) == (tokens, None, False)
    assert scan.forward == event + b"\n\n"


@pytest.mark.parametrize(("options", "sent"), [
    (None, {"include_usage": True}),
    ({"include_usage": False}, {"include_usage": True}),
    ({"continuous_usage_stats": True}, {"include_usage": True}),
    ({"include_usage": False, "continuous_usage_stats": True, "x": 1},
     {"x": 1, "include_usage": True}),
])
def test_usage_asked_for_the_client_leaves_out_continuous_usage(
        options: object, sent: dict[str, object]) -> None:
    assert usage_options(options) == sent


def test_holding_back_after_a_last_chunk_is_bounded() -> None:
    # Choice 0 ends, choice 1 streams on (n=2), and the usage chunk is far off: what is held is
    # released unchanged past the bound, and later events pass as they come.
    from server.sse import MAX_HELD_BYTES

    last0 = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    token1 = b'data: {"choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
    inspector = SseInspector(strip_usage=True)
    forwarded = inspector.feed(last0).forward
    n = MAX_HELD_BYTES // len(token1) + 10
    for _ in range(n):
        forwarded += inspector.feed(token1).forward
    assert forwarded == last0 + token1 * n
    assert not inspector.held


def _chunk(text: str, finish: str | None, usage: dict[str, int] | None) -> bytes:
    obj: dict[str, object] = {"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@pytest.mark.parametrize("strip", [False, True])
def test_usage_on_the_last_choice_chunk_is_counted_once_at_the_end(strip: bool) -> None:
    # Servers that put usage on the chunk with finish_reason and send no usage-only chunk
    # (TGI-style); and vLLM's continuous_usage_stats, where every chunk carries the running
    # counts: both counted once, with the last counts, when the stream ends.
    running = [_chunk("a", None, {"prompt_tokens": 4, "completion_tokens": 1}),
               _chunk("b", None, {"prompt_tokens": 4, "completion_tokens": 2}),
               _chunk("c", "stop", {"prompt_tokens": 4, "completion_tokens": 3})]
    for tail in ([b"data: [DONE]\n\n"],
                 [b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\n',
                  b"data: [DONE]\n\n"]):
        inspector = SseInspector(strip_usage=strip)
        counted = [s.usage for s in (inspector.feed(r) for r in [*running, *tail]) if s.usage]
        assert counted == [(4, 3)]
        assert inspector.done


@settings(max_examples=300)
@given(answer=answers, cuts=st.lists(st.integers(0, 10_000), max_size=8),
       strip=st.booleans())
def test_an_engine_ending_lines_with_crlf_is_read_and_forwarded_with_lf(
        answer: Answer, cuts: list[int], strip: bool) -> None:
    # sse-starlette (llama-cpp-python's server, text-generation-webui) writes CRLF; split
    # anywhere, a CR and its LF in different reads included
    answer = Answer(**{**answer.__dict__, "continuous_usage": False})
    data = stream_bytes(answer)
    crlf = data.replace(b"\n", b"\r\n")
    forwarded, tokens, usage = feed_all(SseInspector(strip_usage=strip), split(crlf, cuts))
    direct, _, _ = feed_all(SseInspector(strip_usage=strip), [data])
    assert forwarded == direct  # the LF stream's own bytes
    assert tokens == answer.n_tokens
    assert usage == (answer.prompt_tokens, answer.n_tokens)
