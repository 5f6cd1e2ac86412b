"""The commands through `launcher.cli.main.main`, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.cli.main import main
from launcher.engine.planfile import plan_from_json
from tests.launcher.paths import H200, TOPOLOGIES, model, topo

CONTRACT = {"mode", "tp", "pp", "dp", "gpus", "predicted", "reasons", "argv", "env", "candidates"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_on_the_h200_dump_chooses_tp2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "plan", "--topology", str(H200), "--model", model("llama-3.3-70b"), "--json"
    )
    assert code == 0
    d = json.loads(out)
    assert d.keys() >= CONTRACT
    assert (d["mode"], d["tp"], d["pp"], d["dp"], d["gpus"]) == ("tp", 2, 1, 1, [0, 1])
    assert set(d["predicted"]) >= {"prefill_tok_s", "decode_tok_s", "throughput_tok_s"}
    assert d["argv"][:2] == ["vllm", "serve"]
    assert "--tensor-parallel-size" in d["argv"]
    assert d["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    for c in d["candidates"]:
        assert {"mode", "tp", "pp", "dp", "predicted", "rejected"} <= c.keys()
    # the JSON reads back into the same plan (launcher serve --plan FILE)
    back = plan_from_json(d)
    assert (back.mode, back.tp, back.gpus, back.max_model_len) == (
        "tp",
        2,
        (0, 1),
        d["max_model_len"],
    )


def test_plan_text_shows_every_candidate_with_both_scores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys,
        "plan",
        "--topology",
        topo("2x3090-nvlink-x8x8"),
        "--model",
        model("llama-3.3-70b-awq"),
        "--workload",
        "throughput",
    )
    assert code == 0
    assert "inter" in out
    assert "thru" in out
    assert "rejected:" in out
    assert "vllm serve" in out


def test_a_model_that_cannot_fit_exits_3_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "plan",
        "--topology",
        topo("2x3090-pcie-x8x8-nop2p"),
        "--model",
        model("llama-3.3-70b"),
    )
    assert code == 3
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("launcher: error: llama-3.3-70b does not fit")
    assert "GiB" in err
    assert "Would fit" in err


def test_a_missing_model_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub's own answers: tests/launcher/test_hub.py
    code, _, err = run(capsys, "plan", "--model", "nobody/nothing")
    assert code == 1
    assert "not in the cache" in err
    assert err.count("\n") == 1


def test_plan_without_gpu_uses_the_cpu_engine(
    capsys: pytest.CaptureFixture[str], tiny_model_path: str
) -> None:
    code, out, _ = run(capsys, "plan", "--model", tiny_model_path, "--json")
    d = json.loads(out)
    assert code == 0
    assert (d["engine"], d["mode"]) == ("cpu", "single")
    assert "no GPU found: CPU engine, 1 replica" in d["reasons"][0]


def test_doctor_on_this_machine_says_no_gpu_and_cpu_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "doctor")
    assert code == 0
    assert "[WARN] gpu: no GPU found" in out
    assert "CPU engine" in out


def test_doctor_json_on_a_saved_topology(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doctor", "--topology", topo("mixed-3090-4090"), "--json")
    checks = json.loads(out)
    assert code == 0
    assert any(c["name"] == "gpu models" and c["status"] == "WARN" for c in checks)


def test_probe_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "probe")
    assert code == 0
    assert "No GPU found" in out


def test_probe_prints_the_matrix_and_saves_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "t.json"
    code, out, _ = run(
        capsys, "probe", "--topology", topo("2x3090-nvlink-x8x8"), "--save", str(saved)
    )
    assert code == 0
    assert "NV4" in out
    assert "x8 (max Gen4 x16) NARROW" in out
    # the saved file is the project's format and plans like the original
    code, out, _ = run(
        capsys, "plan", "--topology", str(saved), "--model", model("llama-3.3-70b-awq"), "--json"
    )
    assert json.loads(out)["transport"] == "nvlink"


def test_probe_json_of_the_measured_h200(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "probe", "--topology", str(TOPOLOGIES / "h200x2-measured.toposerve.json"), "--json"
    )
    d = json.loads(out)
    assert code == 0
    assert d["format"] == "toposerve-topology/1"
    m = d["pairs"][0]["measured"]
    assert m["nccl_transport"] == "nvlink"
    assert m["allreduce_ok"] is True


def test_model_command_prints_the_sizing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "model", "--model", model("gemma-3-27b"))
    assert code == 0
    assert "gemma3" in out
    assert "sliding" in out


def test_plan_predicts_for_the_request_shape_given(capsys: pytest.CaptureFixture[str]) -> None:
    def predicted(*shape: str) -> dict[str, float]:
        code, out, _ = run(
            capsys, "plan", "--topology", str(H200), "--model", model("llama-3.3-70b"),
            "--tp", "2", "--json", *shape,
        )
        assert code == 0
        return dict(json.loads(out)["predicted"])

    short, long = predicted("--prompt", "512", "--gen", "256"), predicted("--prompt", "3072")
    # a longer prompt amortises the per-layer cost: more tokens a second, a longer first token
    assert long["prefill_tok_s"] > short["prefill_tok_s"]
    assert long["ttft_s"] > short["ttft_s"]
    assert predicted() == short  # 512 -> 256 is the default


def test_plan_under_nccl_p2p_disable_predicts_the_shm_fallback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def plan_json() -> dict[str, object]:
        code, out, _ = run(
            capsys, "plan", "--topology", str(H200), "--model", model("llama-3.3-70b"), "--json"
        )
        assert code == 0
        return dict(json.loads(out))

    free = plan_json()
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    off = plan_json()
    assert (free["transport"], off["transport"]) == ("nvlink", "shm")
    prefill = [p["predicted"]["prefill_tok_s"] for p in (free, off)]  # type: ignore[index]
    assert prefill[0] > 1.3 * prefill[1]  # measured on the H200s: 1.46x
    assert any("NCCL_P2P_DISABLE" in r for r in off["reasons"])  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "gpt-oss-20b", "mixtral-8x7b"])
def test_families_beyond_the_fitted_ones_plan_or_refuse_in_one_line(
        capsys: pytest.CaptureFixture[str], name: str) -> None:
    # DeepSeek's latent attention has no k_proj: the planner divided by a KV size of 0.
    code, out, err = run(capsys, "plan", "--topology", topo("2x3090-pcie-x8x8-nop2p"),
                         "--model", model(name), "--json")
    assert "Traceback" not in out + err
    if code == 0:
        d = json.loads(out)
        assert d["max_model_len"] > 0
        assert d["predicted"]["decode_tok_s"] > 0
    else:
        assert code == 3
        assert len(err.strip().splitlines()) == 1


def test_a_model_with_its_own_code_is_told_about_trust_remote_code(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = json.loads(Path(model("llama-3.1-8b"), "config.json").read_text())
    cfg.update(model_type="acme_newarch", architectures=["AcmeForCausalLM"],
               auto_map={"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ["plan", "--topology", str(H200), "--model", str(tmp_path)]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "--trust-remote-code if you trust the repository" in out
    code, out, _ = run(capsys, *argv, "--trust-remote-code")
    assert code == 0
    assert "auto_map" not in out
    assert "--trust-remote-code" in out  # in the engine command


@pytest.mark.parametrize("command", ["plan", "serve"])
def test_fp8_weights_asked_for_after_the_double_dash_are_planned_with(
        capsys: pytest.CaptureFixture[str], command: str) -> None:
    argv = ["--model", model("qwen2.5-32b"), "--topology", topo("2x3090-nvlink-x8x8")]
    code, _, err = run(capsys, "plan", *argv)
    assert code == 3, err  # 61 GiB of bf16 on two 24 GB cards: refused, FP8 suggested
    assert "`-- --quantization fp8`" in err
    extra = ["--", "--quantization", "fp8"]
    code, out, err = run(capsys, command, *argv,
                         *(["--dry-run", "--port", "0"] if command == "serve" else []),
                         *extra)
    assert code == 0, err
    assert "--quantization fp8 (your vLLM flag)" in out or command == "serve"
    assert out.count("--quantization fp8") >= 1  # the user's flag is in the command, last
