"""Property-based fuzz of the proxy's OpenAPI schema (schemathesis): positive and negative
requests to every documented route, against a live proxy in front of the simulated engine;
no answer may be a 5xx.

Driven through hypothesis directly (``operation.as_strategy``): schemathesis' pytest plugin does
not run under pytest 9.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from server.app import create_app
from server.config import ProxyConfig
from simengine.engine import SimConfig, spawn
from tests.server.conftest import run_proxy

SCHEMA = schemathesis.openapi.from_dict(
    create_app(ProxyConfig(upstreams=("http://127.0.0.1:1",))).openapi())
OPERATIONS = {op.label: op for op in (r.ok() for r in SCHEMA.get_all_operations())}


@pytest.fixture(scope="module")
def live_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # An instant engine with a short context, so a fuzzed max_tokens cannot take minutes.
    with spawn(SimConfig(ttft=0.0, itl=0.0, max_model_len=4096)) as sim, run_proxy(
            [sim], "--max-body-bytes", "65536", log_dir=tmp_path_factory.mktemp("fuzz")) as proxy:
        yield proxy.url


def test_schema_documents_the_routes() -> None:
    assert {"POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
            "GET /health", "GET /ready", "GET /metrics"} <= set(OPERATIONS)


CASES = [(label, mode) for label in sorted(OPERATIONS) for mode in GenerationMode
         # a route without parameters or body has no invalid input to make
         if mode == GenerationMode.POSITIVE or label.startswith("POST")]


@pytest.mark.parametrize(("label", "mode"), CASES)
def test_no_input_makes_the_proxy_fail(live_proxy: str, label: str,
                                       mode: GenerationMode) -> None:
    operation = OPERATIONS[label]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(base_url=live_proxy, timeout=10)
        case.validate_response(response, checks=[not_a_server_error])

    fuzz()
