"""A decode step's engine-core cost per extra KV-cache group, split into a part per running
sequence and a fixed part per step (issue 22; hardware.H200_KV_GROUP_STEP_S takes the fixed
part, HostProfile.kv_group_seq_step_s the per-sequence one):

    flock /tmp/toposerve-heavy.lock \
        .venv/bin/python benchmarks/vllm_kv_group_decode_split.py [ROUNDS]

With vllm_kv_group_prompt_cost.run_case (vLLM's own Scheduler, and the V2 model runner's block
tables or none), 512-token prompts decoded at 1 and at 8 sequences, 1 group against Gemma-3-1B's
7: the extra per group at each count, the line through the two points (its slope a sequence,
its intercept the step), in units of the probe's reference workload timed beside it and at the
0.6 ms the other group terms are converted at. Measured in session 19 (5 rounds, reference
0.59-0.61 ms): 4.7 us a sequence and 0.9 us a step per extra group at 0.6 ms."""

from __future__ import annotations

import statistics
import sys

import vllm_kv_group_prompt_cost as p
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import init_none_hash

H200_REFERENCE_MS = 0.6  # the conversion hardware.py uses for every KV-group term


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    init_none_hash(get_hash_fn_by_name("sha256_cbor"))
    cfg = p._engine_config()
    one, seven = p.SHAPES[0], p.SHAPES[-1]
    per: dict[tuple[str, int, int], list[float]] = {}
    refs = []
    for k in range(rounds):
        ref = p.reference_s(5)
        for w in ("none", "v2"):
            for n in (1, 8):
                for s in (one, seven):
                    _, dec = p.run_case(cfg, s, w, 512, n, k, decode=p.DECODE_STEPS)
                    per.setdefault((w, n, s.groups), []).append(dec)
        refs.append(min(ref, p.reference_s(5)))  # the faster of the two: the host's pace
    print("reference ms:", " ".join(f"{r * 1e3:.2f}" for r in refs))
    extra = seven.groups - one.groups
    for w in ("none", "v2"):
        d = {}
        for n in (1, 8):
            rel = [(a - b) / extra / r for a, b, r in
                   zip(per[(w, n, seven.groups)], per[(w, n, one.groups)], refs, strict=True)]
            d[n] = statistics.median(rel)
            print(f"block table {w}, {n} sequence(s): per extra group {d[n] * 1e3:.2f} us a "
                  f"step per ms of reference, at {H200_REFERENCE_MS} ms "
                  f"{d[n] * H200_REFERENCE_MS * 1e3:.2f} us")
        seq = (d[8] - d[1]) / 7
        fixed = d[1] - seq
        print(f"block table {w}: {seq * H200_REFERENCE_MS * 1e3:.2f} us a sequence and "
              f"{fixed * H200_REFERENCE_MS * 1e3:.2f} us a step per extra group at "
              f"{H200_REFERENCE_MS} ms")


if __name__ == "__main__":
    main()
