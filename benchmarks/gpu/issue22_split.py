"""Where a 512-token request's time to first token goes, split by vLLM's own per-request timers.

Issue 22's tables leave two first-token figures unexplained on small models (docs/planner.md,
fifth table): one request on an idle engine varies 1.14-1.44x between requests (the plan lands
on the fastest), and a burst of 32 requests' first tokens come +54..+94 ms later than planned on
every dense shape. This script sends the same requests loadgen's ``single`` and ``c32`` scenarios
send (512 random prompt token ids, 256 generated, streamed) straight to vLLM and through the
proxy, and reads vLLM's ``/metrics`` histogram sums before and after each request (one at a time)
or each burst, so that every request's time splits into the engine's own parts:

- ``queue_s``: scheduled minus queued, both in the engine core (``request_queue_time_seconds``);
- ``prefill_s``: the first token's engine-core timestamp minus scheduled
  (``request_prefill_time_seconds``): the prompt step itself, as the engine core saw it;
- ``front_ttft_s``: the API server's arrival to its output processor's first token
  (``time_to_first_token_seconds``): the engine's parts plus the hand-over both ways;
- ``client_ttft_s``: this client's send to the first streamed chunk: all of the above plus HTTP
  (and the proxy, on the proxy's target).

A one-at-a-time request's deltas are that request's own values; a burst's are means over it.
The GPU's SM clock at each send is read through NVML where it can be (a clock ramp after idle is
one candidate cause of the spread). Measurement only: nothing here is fitted or planned.

    python benchmarks/gpu/issue22_split.py --engine http://127.0.0.1:8100 \
        [--proxy http://127.0.0.1:8000] [--requests 16] [--bursts 3] --json OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# vLLM's per-request histograms (v1/metrics/loggers.py) and the per-step token histogram
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "front_ttft_s",
    "vllm:request_queue_time_seconds": "queue_s",
    "vllm:request_prefill_time_seconds": "prefill_s",
    "vllm:e2e_request_latency_seconds": "e2e_s",
    "vllm:request_inference_time_seconds": "inference_s",
}
STEPS = "vllm:iteration_tokens_total"
# the served shapes' vocabulary: benchmarks/gpu/models keep 4,096 entries (their SOURCE.md files)
MAX_ID = 4096


def _clock() -> Any:
    """NVML's handle to GPU 0, or None where NVML cannot be read (no GPU, no library)."""
    try:
        import pynvml  # type: ignore[import-untyped]

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # any NVML failure means "no clock reading"
        return None


def sm_clock_mhz(handle: Any) -> int | None:
    if handle is None:
        return None
    import pynvml

    try:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:
        return None


async def scrape(client: httpx.AsyncClient, engine: str) -> dict[str, float]:
    """Sums and counts of the histograms above, keyed ``name_sum`` / ``name_count``."""
    text = (await client.get(f"{engine}/metrics", timeout=10)).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in HISTOGRAMS or fam.name == STEPS:
            for s in fam.samples:
                if s.name.endswith(("_sum", "_count")):
                    key = fam.name + s.name[len(fam.name):]
                    out[key] = out.get(key, 0.0) + s.value
    return out


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Per-request means between two scrapes, plus the steps the engine ran between them."""
    out: dict[str, float | None] = {}
    for name, key in HISTOGRAMS.items():
        n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        s = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        out[key] = s / n if n > 0 else None
        out[f"{key}_n"] = n
    out["steps"] = after.get(f"{STEPS}_count", 0.0) - before.get(f"{STEPS}_count", 0.0)
    out["step_tokens"] = after.get(f"{STEPS}_sum", 0.0) - before.get(f"{STEPS}_sum", 0.0)
    return out


async def one(client: httpx.AsyncClient, url: str, model: str, args: argparse.Namespace,
              rng: random.Random) -> dict[str, Any]:
    prompt, gen = args.prompt, args.gen
    # ids inside the vocabulary, above its first (special and byte) tokens
    low = min(1000, args.max_id // 2)
    body = {"model": model, "prompt": [rng.randrange(low, args.max_id) for _ in range(prompt)],
            "max_tokens": gen, "min_tokens": gen, "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    chunks = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        headers = time.perf_counter() - t0
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if json.loads(line[6:]).get("choices"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - t0
    return {"client_ttft_s": first, "headers_s": headers, "client_e2e_s": time.perf_counter() - t0,
            "chunks": chunks}


async def target(name: str, url: str, engine: str, model: str, args: argparse.Namespace,
                 nvml: Any) -> dict[str, Any]:
    rng = random.Random(f"{args.seed}-{name}")
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    # vLLM takes the run's own key (launcher serve's TOPOSERVE_ENGINE_API_KEY); the proxy, on
    # loopback without keys of its own, takes none and sends the engine's upstream itself
    key = args.engine_key if url == engine else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(limits=limits, headers=headers) as client:
        for _ in range(2):  # warm: the first request of a fresh connection pool and engine path
            await one(client, url, model, args, rng)
        plain = []  # back to back, as loadgen's single scenario sends them: no scrape between
        for _ in range(args.requests):
            plain.append(await one(client, url, model, args, rng))
        split = []
        for _ in range(args.requests):
            before = await scrape(client, engine)
            clock = sm_clock_mhz(nvml)
            res = await one(client, url, model, args, rng)
            await asyncio.sleep(0.05)  # the finished request's stats reach /metrics
            res.update(deltas(before, await scrape(client, engine)), sm_clock_mhz=clock)
            split.append(res)
        await asyncio.gather(*(one(client, url, model, args, rng)
                               for _ in range(args.concurrency)))  # the burst's warm-up
        bursts = []
        for _ in range(args.bursts):
            before = await scrape(client, engine)
            res_list = await asyncio.gather(*(one(client, url, model, args, rng)
                                              for _ in range(args.concurrency)))
            await asyncio.sleep(0.1)
            ttfts = sorted(r["client_ttft_s"] for r in res_list if r.get("client_ttft_s"))
            bursts.append({"client_ttft_s": ttfts,
                           "client_ttft_p50_s": statistics.median(ttfts) if ttfts else None,
                           **deltas(before, await scrape(client, engine))})
    return {"target": name, "url": url, "plain": plain, "split": split, "bursts": bursts}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:7.1f}"


def report(res: dict[str, Any]) -> None:
    print(f"== {res['target']} ({res['url']})")
    plain = [r["client_ttft_s"] for r in res["plain"] if r.get("client_ttft_s")]
    if plain:
        print(f"back to back: client TTFT ms min {_ms(min(plain))} median "
              f"{_ms(statistics.median(plain))} max {_ms(max(plain))}")
    print("one at a time:   client   front   queue prefill  e2e(s) steps  SM MHz")
    for r in res["split"]:
        print(f"                {_ms(r.get('client_ttft_s'))} {_ms(r.get('front_ttft_s'))} "
              f"{_ms(r.get('queue_s'))} {_ms(r.get('prefill_s'))}  {r.get('e2e_s') or 0:6.3f} "
              f"{r.get('steps', 0):5.0f}  {r.get('sm_clock_mhz')}")
    for b in res["bursts"]:
        print(f"burst: client p50 {_ms(b['client_ttft_p50_s'])} min {_ms(b['client_ttft_s'][0])} | "
              f"means: front {_ms(b['front_ttft_s'])} queue {_ms(b['queue_s'])} prefill "
              f"{_ms(b['prefill_s'])} | steps {b['steps']:.0f} tokens {b['step_tokens']:.0f}")


async def measure(argv: list[str]) -> dict[str, Any] | int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", required=True, help="vLLM's own URL (its /metrics is read)")
    p.add_argument("--proxy", help="the toposerve proxy in front of it, measured second")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--bursts", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=256)
    p.add_argument("--seed", default="issue22-split")
    p.add_argument("--json", required=True)
    p.add_argument("--max-id", type=int, default=MAX_ID, help="random prompt ids stay below it")
    p.add_argument("--engine-key", default=os.environ.get("TOPOSERVE_ENGINE_API_KEY"),
                   help="vLLM's key (default: TOPOSERVE_ENGINE_API_KEY, as launcher serve reads)")
    args = p.parse_args(argv)
    auth = {"Authorization": f"Bearer {args.engine_key}"} if args.engine_key else {}
    async with httpx.AsyncClient(headers=auth) as c:
        models = (await c.get(f"{args.engine}/v1/models", timeout=10)).json()
    if "data" not in models:
        print(f"issue22_split: {args.engine}/v1/models answered {models!r:.200} (the engine's key: "
              "--engine-key or TOPOSERVE_ENGINE_API_KEY)", file=sys.stderr)
        return 2
    model = models["data"][0]["id"]
    nvml = _clock()
    out = {"model": model, "args": vars(args), "targets": []}
    for name, url in (("engine", args.engine), ("proxy", args.proxy)):
        if url:
            res = await target(name, url, args.engine, model, args, nvml)
            report(res)
            out["targets"].append(res)
    return out


def main(argv: list[str]) -> int:
    out = asyncio.run(measure(argv))
    if isinstance(out, int):
        return out
    with open(out["args"]["json"], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
