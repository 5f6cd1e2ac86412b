"""Record what the proxy's GPU collector exposes on a machine with NVIDIA GPUs, for replay in CI.

    python tests/deploy/record_gpu_metrics.py OUT_DIR [--seconds 5]

Writes OUT_DIR/before.prom and OUT_DIR/during.prom: the proxy's exposition of GpuCollector (the
class the proxy registers, rendered by prometheus_client's generate_latest as the proxy's /metrics
does), before and in the middle of a few seconds of GPU work: peer copies GPU0 <-> GPU1 when
there are two (NVLink or PCIe counters move) plus a matmul loop (utilisation and power move).
Needs torch with CUDA and nvidia-ml-py; the FastAPI app itself is not needed.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from server.metrics import GpuCollector


def exposition() -> bytes:
    registry = CollectorRegistry()
    registry.register(GpuCollector())
    return generate_latest(registry)


def gpu_work(seconds: float, started: threading.Event) -> str:
    import torch

    count = torch.cuda.device_count()
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    big = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
    copied = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        if count > 1:
            big.to("cuda:1", non_blocking=True).to("cuda:0", non_blocking=True)
            copied += 2 * big.numel()
        torch.cuda.synchronize()
        started.set()
    return f"{count} GPU(s); {copied / 2**30:.0f} GiB copied between GPU0 and GPU1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    before = exposition()
    if b"toposerve_gpu_" not in before:
        print("the GPU collector exposed nothing: no NVML or no GPU here", file=sys.stderr)
        return 1
    (args.out / "before.prom").write_bytes(before)
    result: list[str] = []
    started = threading.Event()
    worker = threading.Thread(target=lambda: result.append(gpu_work(args.seconds, started)))
    worker.start()
    # Mid-run, once CUDA is up and one round is done: NVML's utilisation, power and PCIe figures
    # are instantaneous, not cumulative.
    started.wait(timeout=120)
    time.sleep(args.seconds / 2)
    (args.out / "during.prom").write_bytes(exposition())
    worker.join()
    print(result[0] if result else "the GPU work failed (see above)")
    print((args.out / "during.prom").read_text())
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
