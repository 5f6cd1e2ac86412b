"""Option values out of range end in argparse's one line naming the option, for every value."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.cli import argtypes
from launcher.cli.main import main

KINDS = [argtypes.count, argtypes.whole, argtypes.port, argtypes.seconds, argtypes.positive,
         argtypes.name, argtypes.host_port, argtypes.nonempty, argtypes.fraction,
         argtypes.model_ref]


@pytest.mark.parametrize("kind", KINDS, ids=[k.__name__ for k in KINDS])
@given(text=st.text(max_size=12) | st.integers(-(1 << 70), 1 << 70).map(str)
       | st.floats().map(str))
def test_every_value_is_taken_or_refused_with_a_reason(kind: object, text: str) -> None:
    assert callable(kind)
    reason = None
    try:
        kind(text)
    except argparse.ArgumentTypeError as exc:
        reason = str(exc)
    assert reason is None or reason.strip()


@pytest.mark.parametrize(("args", "says"), [
    (["--port", "70000"], "argument --port: a port lies between 0 and 65535"),
    (["--tp", "0"], "argument --tp: must be at least 1"),
    (["--max-model-len", "-5"], "argument --max-model-len: must be at least 1"),
    (["--network-gbps", "nan"], "argument --network-gbps: must be a finite number above 0"),
    (["--served-model-name", ""], "argument --served-model-name: must be a name"),
    (["--ray-address", "x"], "argument --ray-address: expected HOST:PORT"),
    (["--model", ""], "argument --model: must not be empty"),
    (["--gpu-memory-utilization", "1.5"], "argument --gpu-memory-utilization: must be above 0"),
    (["--gpu-memory-utilization", "nan"], "argument --gpu-memory-utilization: must be above 0"),
    (["--model", "https://huggingface.co/Qwen/Qwen3-32B/tree/v2"],
     "pass --model Qwen/Qwen3-32B --revision v2"),
    (["--model", "https://huggingface.co/datasets/org/data"], "is not a model"),
])
def test_serve_refuses_values_out_of_range_before_planning(
        capsys: pytest.CaptureFixture[str], args: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--dry-run", *args])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(("typed", "read"), [
    ("https://huggingface.co/meta-llama/Llama-3.3-70B", "meta-llama/Llama-3.3-70B"),
    ("https://hf.co/Qwen/Qwen3-32B/tree/main", "Qwen/Qwen3-32B"),
    ("https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json", "google/gemma-3-27b-it"),
    ("meta-llama/Llama-3.3-70B-Instruct/", "meta-llama/Llama-3.3-70B-Instruct"),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"),
])
def test_a_hub_model_page_or_an_id_with_a_slash_reads_as_the_id(typed: str, read: str) -> None:
    assert argtypes.model_ref(typed) == read


def test_a_mirror_named_by_hf_endpoint_is_a_hub_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.example")
    assert argtypes.model_ref("https://hf-mirror.example/org/model") == "org/model"


def test_a_local_folder_keeps_its_trailing_slash(tmp_path: object) -> None:
    folder = f"{tmp_path}/"
    assert argtypes.model_ref(folder) == folder
