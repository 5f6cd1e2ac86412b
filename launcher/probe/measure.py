"""`probe --measure`: what each GPU computes and what the links really do, with torch and NCCL.

For each GPU, in a fresh process that sees only it: bf16 matmuls at the shapes of a 512-token
prefill and of decode steps of a 7-70B model, run as vLLM runs an unquantized linear
(``F.linear`` on ``[n x k]`` weights, :func:`time_gemms`), timed (achieved TFLOP/s and GB/s;
the shapes and arithmetic are :mod:`launcher.probe.gpuperf`). The planner uses these over the
datasheet table; `probe --measure` keeps them for later plans on this machine
(:mod:`launcher.pipeline.gpuperfs`).

For each pair, in fresh processes that see only those two GPUs (CUDA_VISIBLE_DEVICES, PCI order):

- a peer copy of 256 MiB, timed (the unidirectional figure p2pBandwidthLatencyTest reports);
- a two-rank NCCL all-reduce with ``NCCL_DEBUG=INFO``: the transport NCCL picked is parsed from
  its log (``via P2P/CUMEM``, ``via P2P/IPC``, ``via SHM/direct/direct``, ``via NET/...``), the
  bus bandwidth of a 64 MiB all-reduce and the time of a one-value all-reduce are timed, and the
  result is checked element by element (a P2P path the driver grants can still corrupt data).

Parsing is pure (:func:`parse_nccl_log`); the workers run as ``python -m
launcher.cli.measure_worker``.
torch is imported only inside the workers.
"""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.errors import MeasureError
from launcher.probe import gpuperf
from launcher.probe.gpuperf import GpuPerf, Sample, Shape
from launcher.probe.topology import Gpu, Measured, Pair, Topology

WORKER_TIMEOUT_S = 180
# NVLink multicast (NVLS) must stay off on the lent machines; a two-rank all-reduce never needs it.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

_CHANNEL = re.compile(
    r"Channel\s+\d+(?:/\d+)?\s*:\s*(\d+)\[[0-9a-fA-Fx]+\]\s*->\s*(\d+)\[[0-9a-fA-Fx]+\]"
    r"(?:\s*\[(?:send|receive)\])?\s+via\s+(\S+(?: pointer)?(?:/\S+)*)"
)
_VERSION = re.compile(r"NCCL version (\S+)")


@dataclass(frozen=True)
class NcclLog:
    version: str | None
    connections: tuple[tuple[int, int, str], ...]  # (from rank, to rank, "P2P/CUMEM/read")

    @property
    def transports(self) -> frozenset[str]:
        """The transport families seen: P2P, SHM, NET, NVLS, COLLNET."""
        return frozenset(c[2].split("/")[0].split()[0].upper() for c in self.connections)


def parse_nccl_log(text: str) -> NcclLog:
    """Channel connections and the version from NCCL_DEBUG=INFO output (any number of ranks)."""
    conns = []
    for m in _CHANNEL.finditer(text):
        conns.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    version = _VERSION.search(text)
    return NcclLog(version.group(1) if version else None, tuple(dict.fromkeys(conns)))


def classify(log: NcclLog, nvlinks: int) -> str | None:
    """The planner's transport name for what NCCL did between two GPUs on one host.

    NCCL says P2P for NVLink and PCIe alike; NVML's link count tells them apart. The slowest
    transport seen wins: one SHM channel among P2P ones sets the pace of a ring.
    """
    t = log.transports
    if "NET" in t or "COLLNET" in t:
        return "net"
    if "SHM" in t:
        return "shm"
    if "P2P" in t or "NVLS" in t:
        return "nvlink" if nvlinks > 0 else "p2p-pcie"
    return None


# ------------------------------------------------------------------------------ orchestration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pair_env(env: Mapping[str, str], p: Pair) -> dict[str, str]:
    out = {**SAFE_ENV, **env}
    out.update({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": f"{p.a},{p.b}"})
    return out


def _worker(args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.cli.measure_worker", *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _finish(procs: Sequence[subprocess.Popen[bytes]], what: str) -> None:
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise MeasureError(
                f"{what} did not finish in {WORKER_TIMEOUT_S} s; a hung NCCL "
                "all-reduce often means P2P that the driver grants but the "
                "board cannot carry: try NCCL_P2P_DISABLE=1"
            ) from None
        if proc.returncode != 0:
            tail = out.decode(errors="replace").strip().splitlines()[-5:]
            raise MeasureError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def measure_pair(p: Pair, env: Mapping[str, str], workdir: Path) -> Measured:
    penv = _pair_env(env, p)
    copy_out = workdir / f"copy-{p.a}-{p.b}.json"
    _finish([_worker(["copy", "--out", str(copy_out)], penv)], f"peer copy GPU{p.a}-GPU{p.b}")
    copy = json.loads(copy_out.read_text())
    port, ar_out = _free_port(), workdir / f"allreduce-{p.a}-{p.b}.json"
    logs = workdir / f"nccl-{p.a}-{p.b}"
    logs.mkdir()
    nenv = {**penv, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(logs / "nccl.%p.log")}
    procs = [
        _worker(["allreduce", "--rank", str(r), "--port", str(port), "--out", str(ar_out)], nenv)
        for r in (0, 1)
    ]
    _finish(procs, f"NCCL all-reduce GPU{p.a}-GPU{p.b}")
    ar = json.loads(ar_out.read_text())
    log = parse_nccl_log("\n".join(f.read_text(errors="replace") for f in logs.glob("nccl.*.log")))
    return Measured(
        bandwidth_gbs=copy["copy_gbs"],
        allreduce_gbs=ar["busbw_gbs"],
        latency_us=ar["latency_us"],
        nccl_transport=classify(log, p.nvlinks),
        allreduce_ok=ar["ok"],
    )


def measure_gpu(g: Gpu, env: Mapping[str, str], workdir: Path) -> GpuPerf | None:
    """The GPU's achieved GEMM rates, timed in a process that sees only this GPU."""
    genv = {**SAFE_ENV, **env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": str(g.index)}
    out = workdir / f"gemm-{g.index}.json"
    _finish([_worker(["gemm", "--out", str(out)], genv)], f"GEMM timing on GPU{g.index}")
    perf, reasons = gpuperf.perf_from_json(json.loads(out.read_text()))
    if reasons:
        raise MeasureError(f"GEMM timing on GPU{g.index} gave unusable figures: {reasons[0]}")
    return perf


def measure_topology(topo: Topology, env: Mapping[str, str]) -> Topology:
    """The topology with every GPU's GEMM rates and every pair's link figures filled in."""
    if not topo.gpus:
        raise MeasureError(
            "no GPU found, so there is nothing to measure; the planner will use "
            "the CPU engine (run `launcher doctor` for why no GPU is seen)"
        )
    if importlib.util.find_spec("torch") is None:
        raise MeasureError(
            "--measure needs PyTorch with CUDA in this environment "
            "(pip install torch); NVML alone cannot time a copy"
        )
    with tempfile.TemporaryDirectory(prefix="toposerve-measure-") as tmp:
        gpus = tuple(replace(g, perf=measure_gpu(g, env, Path(tmp))) for g in topo.gpus)
        pairs = tuple(replace(p, measured=measure_pair(p, env, Path(tmp))) for p in topo.pairs)
    bad = [f"GPU{p.a}-GPU{p.b}" for p in pairs if p.measured and p.measured.allreduce_ok is False]
    notes = [f"measured {time.strftime('%Y-%m-%d %H:%M:%S')}"]
    notes += [f"GPU{g.index} measured: {g.perf.describe()} (timed as {TIMED_AS})"
              for g in gpus if g.perf is not None]
    if len(gpus) < 2:
        notes.append("one GPU: no link to measure")
    if bad:
        notes.append(
            f"all-reduce gave WRONG results between {', '.join(bad)}: do not use P2P there "
            "(NCCL_P2P_DISABLE=1)"
        )
    return replace(topo, gpus=gpus, pairs=pairs, notes=(*topo.notes, *notes))


# ------------------------------------------------------------------------------------ workers


def copy_worker(out: Path) -> None:
    import torch

    size = 256 << 20
    src = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:1")
    peer = bool(torch.cuda.can_device_access_peer(0, 1))

    def sync() -> None:
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)

    for _ in range(3):
        dst.copy_(src)
    sync()
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    sync()
    copy_gbs = size * reps / (time.perf_counter() - t0) / 1e9
    small_src, small_dst = src[:4], dst[:4]
    t0 = time.perf_counter()
    for _ in range(200):
        small_dst.copy_(small_src)
        sync()
    latency_us = (time.perf_counter() - t0) / 200 * 1e6
    out.write_text(
        json.dumps({"peer_access": peer, "copy_gbs": copy_gbs, "copy_latency_us": latency_us})
    )


def _graph_allreduce_us(torch: Any, dist: Any, reps: int = 100) -> float | None:
    """Device time of a one-value all-reduce, replayed from a CUDA graph as vLLM's decode does.

    Timed eagerly, each call costs ~30-40 us of host dispatch that vLLM never pays (measured on
    the H200 pair: 43 us eager over NVLink, 28 us over SHM: the host, not the link). None when
    this torch/NCCL cannot capture collectives.
    """
    z = torch.ones(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(5):
                dist.all_reduce(z)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                dist.all_reduce(z)
        graph.replay()
        torch.cuda.synchronize()
    except RuntimeError:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) * 1e3 / (10 * reps)


def allreduce_worker(rank: int, port: int, out: Path, world: int = 2) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    n = 16 << 20  # 64 MiB of float32
    base = torch.arange(n, device="cuda", dtype=torch.float32).remainder_(251)
    x = base + rank
    dist.all_reduce(x)
    # small integers: the float sums are exact, so any difference is corruption
    ok = bool(torch.equal(x, base * world + sum(range(world))))
    flags = torch.tensor([1 if ok else 0], device="cuda")
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    y = torch.ones(n, device="cuda")
    for _ in range(3):
        dist.all_reduce(y)
    torch.cuda.synchronize()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(y)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / reps
    busbw = 2 * (world - 1) / world * n * 4 / per / 1e9
    latency_us = _graph_allreduce_us(torch, dist)
    if rank == 0:
        out.write_text(
            json.dumps(
                {"ok": bool(flags.item() == 1), "busbw_gbs": busbw, "latency_us": latency_us}
            )
        )
    dist.destroy_process_group()


def _elapsed(torch: Any, device: str, fn: Any, reps: int) -> float:
    """Seconds for ``reps`` calls of ``fn`` after it has run once (CUDA events on a GPU)."""
    fn()
    if device == "cpu":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return time.perf_counter() - t0
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1e3


# Decode weights cycled through at least this many bytes per shape, so that no cache (L2 is at
# most ~130 MB on current GPUs) holds them between steps: every step reads from memory.
DECODE_CYCLE_BYTES = 1 << 30


# What the GEMM timing runs, for the probe's line and the record's method.
TIMED_AS = "bf16 F.linear as vLLM's unquantized linear ([n x k] weights)"


def time_gemms(torch: Any, device: str, shapes: Sequence[Shape], reps: int = 20,
               cycle_bytes: int = DECODE_CYCLE_BYTES) -> list[Sample]:
    """Time bf16 ``[m x k] x [k x n]`` products of each shape on ``device`` ("cuda" or "cpu")
    as vLLM runs an unquantized linear layer (UnquantizedLinearMethod.apply:
    ``torch.nn.functional.linear(x, weight)``, the weight ``[n x k]`` and contiguous as a
    checkpoint stores it; cuBLAS runs it with the weight transposed), prefill and decode alike.
    ``torch.matmul`` on a ``[k x n]`` weight is another cuBLAS layout: on the H200 it ran the
    prefill shapes 740-800 TFLOP/s where vLLM's own linears ran 620-710 (issue 22)."""
    linear = torch.nn.functional.linear
    samples = []
    for kind, m, k, n in shapes:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        one = k * n * gpuperf.DTYPE_BYTES
        copies = max(1, -(-cycle_bytes // one)) if kind == "decode" else 1
        ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(copies)]
        state = {"i": 0}

        def step(x: Any = x, ws: Any = ws, state: dict[str, int] = state) -> None:
            state["i"] = (state["i"] + 1) % len(ws)
            linear(x, ws[state["i"]])

        # for decode, at least one full cycle through the copies, so each is read from memory
        count = max(reps, copies) if kind == "decode" else reps
        samples.append(Sample(kind, m, k, n, count, _elapsed(torch, device, step, count)))
        del ws, x
        if device != "cpu":
            torch.cuda.empty_cache()
    return samples


def time_graph_gemvs(torch: Any, ns: Sequence[int] = gpuperf.GRAPH_GEMV_NS,
                     k: int = gpuperf.GRAPH_GEMV_K, calls: int = 40,
                     cycle_bytes: int = DECODE_CYCLE_BYTES) -> list[gpuperf.GraphSample]:
    """One-row bf16 GEMVs of each ``[1 x k] x [k x n]`` shape, ``calls`` of them (at least one
    pass over weight copies of ``cycle_bytes``, so that every call reads from memory) captured
    back to back in one CUDA graph; the median replay of five, as vLLM replays a decode step.
    Run as vLLM's unquantized linear layers run them (``F.linear`` on ``[n x k]`` weights), the
    call the H200's kernel tables timed."""
    samples = []
    for n in ns:
        copies = max(1, -(-cycle_bytes // (k * n * gpuperf.DTYPE_BYTES)))
        count = max(calls, copies)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        linear = torch.nn.functional.linear
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch asks
            for w in ws[:3]:
                linear(x, w)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(count):
                linear(x, ws[i % copies])
        graph.replay()
        torch.cuda.synchronize()
        rounds = []
        for _ in range(5):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            rounds.append(float(start.elapsed_time(end)) / 1e3)
        samples.append(gpuperf.GraphSample(k, n, count, sorted(rounds)[len(rounds) // 2]))
        del graph, ws, x
        torch.cuda.empty_cache()
    return samples


def graph_kernel(torch: Any, device: str) -> tuple[float | None, tuple[gpuperf.GraphSample, ...],
                                                   str | None]:
    """The per-kernel graph cost (gpuperf.graph_kernel_fit), its GEMVs, and where it is not
    there why (one line): never raises, so that a failure here leaves the GEMM rates' timing
    standing."""
    if device != "cuda":
        return None, (), "no CUDA here: a CUDA graph's per-kernel cost is not timed"
    try:
        samples = tuple(time_graph_gemvs(torch))
    except Exception as exc:  # any failure: the probe's other figures stand
        text = str(exc).strip().splitlines()
        return None, (), f"the CUDA-graph timing failed: {type(exc).__name__}: " \
            f"{(text[0] if text else '')[:120]}"
    fit = gpuperf.graph_kernel_fit(samples)
    if fit is None:
        return None, samples, "the GEMVs' times gave no positive fixed cost and rate"
    return fit[0], samples, None


def gemm_worker(out: Path, device: str, tiny: bool) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device here (a CPU-only torch, or no driver)")
    if tiny:  # the same path on shapes a CPU times in well under a second
        shapes = [*gpuperf.prefill_shapes(64, tokens=16), *gpuperf.decode_shapes(64, (1, 4))]
        samples = time_gemms(torch, device, shapes, reps=3, cycle_bytes=1 << 16)
    else:
        samples = time_gemms(torch, device, gpuperf.default_shapes())
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    method = (f"torch {torch.__version__} {TIMED_AS} on {device}, "
              f"{len(samples)} shapes{' (tiny)' if tiny else ''}")
    perf = gpuperf.summarize(samples, device=name, method=method)
    kernel_s, graph, note = (graph_kernel(torch, device) if not tiny
                             else (None, (), "not timed in a tiny run"))
    perf = replace(perf, kernel_s=kernel_s, graph_samples=graph, kernel_note=note)
    out.write_text(json.dumps(gpuperf.perf_to_json(perf)))
