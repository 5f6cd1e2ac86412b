"""`launcher serve --dry-run`: the plan and the exact engine commands, nothing started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, TOPOLOGIES, free_port

H200 = TOPOLOGIES / "h200x2-nvlink.nvml.json"
LLAMA70B = REPO / "benchmarks" / "gpu" / "models" / "llama-3.3-70b-shape"


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--dry-run", "--port", str(free_port()),
         *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_without_gpus_the_embedded_model_is_planned_on_the_cpu_engine() -> None:
    res = dry_run()
    assert res.returncode == 0, res.stderr
    assert "no GPU found: CPU engine, 1 replica" in res.stdout
    assert "--served-model-name toposerve-tiny" in res.stdout
    assert "VLLM_CPU_KVCACHE_SPACE=1" in res.stdout


def test_a_70b_model_on_two_nvlinked_h200s_is_served_with_tensor_parallel() -> None:
    res = dry_run("--topology", str(H200), "--model", str(LLAMA70B))
    assert res.returncode == 0, res.stderr
    assert "--tensor-parallel-size 2" in res.stdout
    assert "CUDA_VISIBLE_DEVICES=0,1" in res.stdout
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in res.stdout


def test_forced_replicas_become_one_engine_per_gpu_on_its_own_port() -> None:
    qwen32 = REPO / "benchmarks" / "gpu" / "models" / "qwen2.5-32b-shape"
    res = dry_run("--topology", str(H200), "--model", str(qwen32), "--dp", "2",
                  "--engine-port", "9100")
    assert res.returncode == 0, res.stderr
    engines = [ln for ln in res.stdout.splitlines() if ln.strip().startswith("engine:")]
    assert len(engines) == 2
    assert "CUDA_VISIBLE_DEVICES=0 " in engines[0]
    assert "--port 9100" in engines[0]
    assert "CUDA_VISIBLE_DEVICES=1 " in engines[1]
    assert "--port 9101" in engines[1]
    assert all("--data-parallel-size" not in e for e in engines)


def test_ray_address_runs_the_engine_on_the_ray_cluster() -> None:
    res = dry_run("--topology", str(H200), "--model", str(LLAMA70B),
                  "--ray-address", "10.0.0.5:6379")
    assert res.returncode == 0, res.stderr
    assert "RAY_ADDRESS=10.0.0.5:6379" in res.stdout
    assert "--distributed-executor-backend ray" in res.stdout


def test_extra_arguments_reach_vllm_last(tmp_path: Path) -> None:
    res = dry_run("--", "--max-num-seqs", "7")
    assert res.returncode == 0, res.stderr
    engine = next(ln for ln in res.stdout.splitlines() if "engine:" in ln)
    assert engine.rstrip().endswith("--max-num-seqs 7")


def test_a_saved_plan_is_served_as_saved(tmp_path: Path) -> None:
    plan = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", "--topology", str(H200), "--model",
         str(LLAMA70B), "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    saved = json.loads(plan.stdout)
    saved["vllm_extra_args"] = ["--max-num-seqs", "3"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(saved))
    res = dry_run("--plan", str(path), "--model", str(LLAMA70B))
    assert res.returncode == 0, res.stderr
    assert "--tensor-parallel-size 2" in res.stdout
    assert "--max-num-seqs 3" in res.stdout


def test_a_saved_agent_plan_is_served_with_the_agent_plans_engine_flags(tmp_path: Path) -> None:
    # `plan --json --workload agent` prints a command with the agent plan's flags (KV offloading
    # here); `serve --plan` of that file must start that command, not the plan without them
    import os

    pair = TOPOLOGIES / "2x3090-p2p-x16.nvml.json"
    llama8b = REPO / "tests" / "fixtures" / "models" / "llama-3.1-8b"
    plan = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", "--topology", str(pair), "--model",
         str(llama8b), "--workload", "agent", "--sessions", "8", "--context", "64K", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "TOPOSERVE_HOST_FREE_GIB": "256"})
    assert plan.returncode == 0, plan.stderr
    printed = json.loads(plan.stdout)
    assert "--kv-offloading-size" in printed["argv"]
    path = tmp_path / "agent-plan.json"
    path.write_text(plan.stdout)
    res = dry_run("--plan", str(path), "--model", str(llama8b))
    assert res.returncode == 0, res.stderr
    engine = next(ln for ln in res.stdout.splitlines() if "engine:" in ln)
    flags = printed["argv"][printed["argv"].index("--kv-offloading-size"):][:4]
    assert " ".join(flags) in engine


def test_a_plan_file_that_is_not_json_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    res = dry_run("--plan", str(path))
    assert res.returncode == 1
    assert "is not JSON" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_model_that_does_not_fit_is_a_one_line_error_with_the_numbers() -> None:
    topo = REPO / "tests" / "fixtures" / "topologies" / "2x3090-nvlink-x8x8.nvml.json"
    res = dry_run("--topology", str(topo),
                  "--model", str(REPO / "tests" / "fixtures" / "models" / "llama-3.3-70b"))
    assert res.returncode == 3
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "GiB" in lines[0]
    assert "Traceback" not in res.stderr


def test_engine_host_sets_where_vllm_listens_and_the_proxy_still_reaches_it() -> None:
    res = dry_run("--engine-host", "0.0.0.0", "--engine-port", "9100")
    assert res.returncode == 0, res.stderr
    engine = next(ln for ln in res.stdout.splitlines() if "engine:" in ln)
    assert "--host 0.0.0.0 --port 9100" in engine
    assert "proxy upstreams: http://127.0.0.1:9100" in res.stdout
    default = dry_run("--engine-port", "9100")
    assert "--host 127.0.0.1 --port 9100" in default.stdout  # only the proxy reaches vLLM


def test_layer_stages_for_other_ray_nodes_without_nodes_say_to_pass_nodes() -> None:
    four = TOPOLOGIES / "4xh200-nvswitch.nvml.json"
    res = dry_run("--topology", str(four), "--model", str(LLAMA70B), "--ray-address",
                  "10.0.0.5:6379", "--tp", "4", "--pp", "2")
    assert res.returncode == 3, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.endswith("with --nodes (e.g. --nodes 2)")
    ok = dry_run("--topology", str(four), "--model", str(LLAMA70B), "--ray-address",
                 "10.0.0.5:6379", "--tp", "4", "--pp", "2", "--nodes", "2")
    assert ok.returncode == 0, ok.stderr


def test_a_plan_for_gpus_this_machine_lacks_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", "--topology",
         str(TOPOLOGIES / "8xh100-nvswitch.nvml.json"), "--model", str(LLAMA70B), "--tp", "4",
         "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    path = tmp_path / "plan.json"
    path.write_text(made.stdout)
    assert len(json.loads(made.stdout)["gpus"]) == 4
    # served on the H200 pair: GPUs 2 and 3 do not exist there
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--plan", str(path), "--topology", str(H200),
         "--model", str(LLAMA70B), "--port", str(free_port())],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1, res.stderr
    assert "and this machine has GPU 0, 1: plan here" in res.stderr
    # a dry run shows the plan and says the same as a note
    res = dry_run("--plan", str(path), "--topology", str(H200), "--model", str(LLAMA70B))
    assert res.returncode == 0, res.stderr
    assert "and this machine has GPU 0, 1" in res.stdout
