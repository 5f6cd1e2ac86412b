"""What loadgen learns from the server before a run: model, context length, token ids, plan.

A thin synchronous shell over httpx; the parsing parts are pure functions. Every failure becomes
a TargetError whose message says what to do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadgen.errors import ContextTooShort, NoTokenize, TargetError
from loadgen.sse import error_message
from topocommon import jsontext

_PLAN_KEYS = ("mode", "tp", "pp", "dp", "transport", "engine")


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    max_model_len: int | None
    plan: str  # "unknown" when the server does not export toposerve_plan_info
    # False when the server refuses vLLM's exact-length fields (min_tokens, ignore_eos), as
    # OpenAI's API does: requests go without them and may end before --gen tokens.
    exact_length: bool = True


@contextmanager
def _translated(url: str, what: str) -> Iterator[None]:
    """httpx failures -> TargetError with the fix."""
    try:
        yield
    except httpx.ConnectError as exc:
        raise TargetError(
            f"cannot reach {url} ({exc}): start the server (`launcher serve`) or pass --url"
        ) from None
    except httpx.TimeoutException:
        raise TargetError(f"{url} did not answer {what} in time: is it overloaded?") from None
    except httpx.HTTPError as exc:
        raise TargetError(f"{what} at {url} failed: {exc}") from None


def reason(response: httpx.Response) -> str:
    """``HTTP <status>: <the server's own words>`` in one line: the message of an OpenAI, vLLM
    or FastAPI error body, else the start of the body as text. What a user needs to fix a
    refusal is in the server's words (vLLM: "... chat template ..."), never only its status."""
    try:
        detail = error_message(jsontext.loads(response.content))  # what httpx's .json() reads
    except ValueError:
        detail = response.text[:200]
    detail = " ".join(detail.split()) or "(empty body)"
    return f"HTTP {response.status_code}: {detail}"


def _check(response: httpx.Response) -> Any:
    # response.url names the route: said once ("POST http://h:p/v1/chat/completions answered
    # HTTP 400: ..."), the server's own reason after it
    where = f"{response.request.method} {response.url}"
    if response.status_code in (401, 403):
        raise TargetError(f"{where} was refused ({reason(response)}): pass --api-key")
    if response.status_code != 200:
        raise TargetError(f"{where} answered {reason(response)}")
    try:
        return jsontext.loads(response.content)
    except ValueError:
        raise TargetError(f"{where} answered with something that is not JSON") from None


class TargetClient:
    """Control-plane calls (never timed): /v1/models, /tokenize, /metrics."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def models(self) -> list[dict[str, Any]]:
        with _translated(self.url, "/v1/models"):
            body = _check(self._http.get("/v1/models"))
        data = body.get("data") if isinstance(body, dict) else None
        # a model is asked for by its id: an entry without a string id names no model (it was
        # sent as the model "None"), and a list of anything but such entries lists none
        listed = data if isinstance(data, list) else []
        models = [m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)
                  and m["id"]]
        if not models:
            raise TargetError(f"{self.url}/v1/models lists no model: is the engine loaded?")
        return models

    def tokenize(self, model: str, **fields: Any) -> dict[str, Any]:
        """POST /tokenize (vLLM's): `prompt=text` or `messages=[...]`."""
        with _translated(self.url, "/tokenize"):
            response = self._http.post("/tokenize", json={"model": model, **fields})
        if response.status_code in (400, 404, 405, 422, 501):
            raise NoTokenize(
                f"{self.url} has no vLLM-style /tokenize for this request ({reason(response)})",
                reason(response),
            )
        body = _check(response)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        # token ids are what prompts are built of: a list of anything else is no token list
        if not isinstance(tokens, list) or not all(is_count(t) for t in tokens):
            raise NoTokenize(f"{self.url}/tokenize answered without a vLLM-style token list")
        answer: dict[str, Any] = body
        return answer

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """A control-plane POST (calibration requests), JSON in and out."""
        with _translated(self.url, path):
            return _check(self._http.post(path, json=body))

    def metrics_text(self, url: str | None = None) -> str | None:
        """The /metrics exposition (of `url` when given, e.g. the engine behind a proxy), or
        None when the server has none (not an error)."""
        try:
            response = self._http.get(url or "/metrics")
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None


def pick_model(models: list[dict[str, Any]], wanted: str | None, url: str) -> dict[str, Any]:
    names = [str(m.get("id")) for m in models]
    if wanted is None:
        return models[0]
    for model in models:
        if model.get("id") == wanted:
            return model
    raise TargetError(
        f"{url} does not serve model {wanted!r}; it serves {', '.join(names)}: fix --model"
    )


def max_model_len(model: Mapping[str, Any], tokenize_body: Mapping[str, Any] | None) -> int | None:
    for source in (model, tokenize_body or {}):
        value = source.get("max_model_len")
        if is_count(value) and value > 0:
            return value
    return None


def is_count(value: object) -> TypeGuard[int]:
    """A whole number of tokens as JSON gives one: an int, not a bool (JSON's true is no
    count), not negative."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def plan_label(metrics_text: str | None) -> str:
    """'tp=2,pp=1,dp=1,...' from toposerve_plan_info, or 'unknown' when it is absent."""
    if not metrics_text:
        return "unknown"
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return "unknown"
    for family in families:
        for sample in family.samples:
            if sample.name == "toposerve_plan_info" and sample.value == 1:
                labels = sample.labels
                # A proxy started without a plan exports the info gauge with empty labels.
                joined = ",".join(f"{k}={labels[k]}" for k in _PLAN_KEYS if labels.get(k))
                return joined or "unknown"
    return "unknown"


def check_context(max_len: int | None, prompt: int, gen: int, model: str) -> None:
    if max_len is not None and prompt + gen > max_len:
        raise ContextTooShort(
            f"model {model!r} has a context of {max_len} tokens, shorter than --prompt {prompt}"
            f" + --gen {gen} = {prompt + gen}: lower them, or serve it with a longer"
            " --max-model-len",
            max_len,
        )
