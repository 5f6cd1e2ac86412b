"""How many experts a MoE's router picks under vLLM's `--load-format dummy` weights.

Why: every MoE served on the H200 with dummy weights ran 32 streams faster than reading
the experts that trained routing touches allows (issue 22). This serves a model folder on
the CPU build of vLLM at reduced depth, with vLLM's own dummy loader and router, and counts
per MoE layer how many distinct experts the top-k picks: for each 512-token prefill and for
each 32-token decode step (greedy, as loadgen sends). A count far below the independent-
routing expectation E * (1 - (1 - k/E)^n) flags a dummy-weight figure as unrepresentative.

`--init` picks how the weights are filled, before vLLM's post-load processing:
  dummy    vLLM's dummy loader unchanged: every float tensor uniform(-1e-3, 1e-3), each
           from a generator seeded 1234 (weight_utils.initialize_single_dummy_weight);
  routers  dummy, but each router weight normal(0, 0.02), its correction bias 0 and the
           RMSNorm weights 1 (what a router-only checkpoint overlay would give);
  trained  a fresh model as Hugging Face initialises it: matrices normal(0, 0.02), norms 1,
           biases 0 (random, not trained, but hidden states of trained scale).

Run (CPU, a few minutes a variant):
  VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/moe_dummy_routing.py \
      benchmarks/gpu/models/moonlight-16b-a3b-shape --layers 4 --init dummy
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass

# The router hook below patches a class in this process: the engine core must run here.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch

STD = 0.02  # Hugging Face's initializer_range for these configs (config.json)


@dataclass(frozen=True)
class LayerCount:
    layer: int
    prefill_distinct_mean: float  # distinct experts one 512-token prompt touches
    prefill_top_k_share: float  # share of the prompt's picks on its k most-picked experts
    decode_distinct_mean: float  # distinct experts one 32-token decode step touches
    decode_distinct_min: int
    decode_top_k_share: float
    decode_tokens: int
    most_picked: tuple[int, ...]  # the k experts picked most over prefill and decode


def independent_distinct(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts when each token picks k of E independently and uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def _fill(name: str, tensor: torch.Tensor, init: str, gen: torch.Generator) -> None:
    from vllm.model_executor.model_loader.weight_utils import initialize_single_dummy_weight

    if not torch.is_floating_point(tensor):
        return
    is_norm = name.endswith("norm.weight") or "layernorm" in name
    is_router = ".gate.weight" in name and ".mlp." in name
    is_bias = name.endswith("bias")
    if init == "dummy" or (init == "routers" and not (is_norm or is_router or is_bias)):
        initialize_single_dummy_weight(tensor)
    elif is_norm:
        tensor.fill_(1.0)
    elif is_bias:
        tensor.zero_()
    elif init == "routers" and not is_router:
        initialize_single_dummy_weight(tensor)
    else:
        tensor.normal_(0.0, STD, generator=gen)


def _patch_loader(init: str) -> None:
    # Same walk as DummyModelLoader.load_weights, with the module path known so a variant
    # can treat routers and norms differently; vLLM's post-load processing runs after it.
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader
    from vllm.model_executor.model_loader.reload.utils import get_layer_tensors

    def load_weights(self: object, model: torch.nn.Module, model_config: object) -> None:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for mod_name, layer in model.named_modules():
                for name, tensor in get_layer_tensors(layer).items():
                    if name not in layer._non_persistent_buffers_set:
                        _fill(f"{mod_name}.{name}", tensor, init, gen)

    DummyModelLoader.load_weights = load_weights  # type: ignore[method-assign]


def _patch_router(calls: list[tuple[int, torch.Tensor]]) -> None:
    from vllm.model_executor.layers.fused_moe.router.fused_moe_router import FusedMoERouter

    original = FusedMoERouter.select_experts

    def select_experts(self: FusedMoERouter, *args: object, **kwargs: object) -> object:
        out = original(self, *args, **kwargs)  # type: ignore[arg-type]
        calls.append((id(self), out[1].detach().to("cpu", torch.int64).clone()))
        return out

    FusedMoERouter.select_experts = select_experts  # type: ignore[method-assign]


def _share_top_k(ids: torch.Tensor, experts: int, top_k: int) -> float:
    load = torch.bincount(ids.flatten(), minlength=experts).float()
    return float(load.topk(top_k).values.sum() / load.sum())


def count(calls: list[tuple[int, torch.Tensor]], experts: int, top_k: int,
          prompts: int, prompt_len: int) -> list[LayerCount]:
    order: dict[int, int] = {}
    for rid, _ in calls:
        order.setdefault(rid, len(order))
    out = []
    for rid, layer in order.items():
        mine = [ids for r, ids in calls if r == rid]
        # vLLM's CPU build caps a step at 2048 tokens, so prefills come in chunks beside
        # other requests' decode tokens: windows of prompt_len rows of the prefill steps.
        seqs = [ids[i:i + prompt_len] for ids in mine if ids.shape[0] >= prompt_len
                for i in range(0, ids.shape[0] - prompt_len + 1, prompt_len)]
        # Only steps where every stream decodes one token count as decode steps.
        decode = [ids for ids in mine if ids.shape[0] == prompts]
        pd = [len(torch.unique(s)) for s in seqs]
        dd = [len(torch.unique(d)) for d in decode]
        out.append(LayerCount(
            layer=layer,
            prefill_distinct_mean=sum(pd) / len(pd),
            prefill_top_k_share=sum(_share_top_k(s, experts, top_k) for s in seqs) / len(seqs),
            decode_distinct_mean=sum(dd) / max(1, len(dd)),
            decode_distinct_min=min(dd, default=0),
            decode_top_k_share=sum(_share_top_k(d, experts, top_k) for d in decode)
            / max(1, len(decode)),
            decode_tokens=sum(int(d.shape[0]) for d in decode),
            most_picked=tuple(int(e) for e in torch.bincount(
                torch.cat(mine).flatten(), minlength=experts).topk(top_k).indices.sort().values),
        ))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a model folder (config.json + tokenizer)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers kept (real dims)")
    ap.add_argument("--init", choices=("dummy", "routers", "trained"), default="dummy")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=24,
                    help="tokens generated a stream (the staggered prefills take ~10 steps)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts"))
    top_k = int(cfg["num_experts_per_tok"])

    calls: list[tuple[int, torch.Tensor]] = []
    _patch_loader(args.init)
    _patch_router(calls)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, load_format="dummy", dtype="bfloat16", enforce_eager=True,
              hf_overrides={"num_hidden_layers": args.layers}, max_model_len=1024,
              max_num_seqs=args.prompts, max_num_batched_tokens=args.prompts * args.prompt_len,
              enable_prefix_caching=False, seed=0,
              # On the CPU build this reserves host memory for the KV cache; a few MB do here.
              gpu_memory_utilization=0.4)
    g = torch.Generator().manual_seed(1)
    vocab = int(cfg["vocab_size"])
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(2, vocab, (args.prompt_len,),
                                                           generator=g).tolist())
               for _ in range(args.prompts)]
    calls.clear()  # the profile and warm-up runs route dummy batches
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.gen,
                                                 min_tokens=args.gen, ignore_eos=True))
    generated = [o.outputs[0].token_ids for o in outs]
    rows = count(calls, experts, top_k, args.prompts, args.prompt_len)
    first_tokens = len({tuple(t[:1]) for t in generated})
    report = {
        "model": os.path.basename(os.path.normpath(args.model)), "init": args.init,
        "layers": args.layers, "experts": experts, "top_k": top_k,
        "independent_prefill": independent_distinct(experts, top_k, args.prompt_len),
        "independent_decode": independent_distinct(experts, top_k, args.prompts),
        "distinct_generated_sequences": len({tuple(t) for t in generated}),
        "distinct_first_tokens": first_tokens,
        "per_layer": [asdict(r) for r in rows],
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['model']} init={args.init} layers={args.layers} E={experts} k={top_k}: "
          f"independent routing would touch {report['independent_prefill']:.1f} per "
          f"{args.prompt_len}-token prompt, {report['independent_decode']:.1f} per "
          f"{args.prompts}-token decode step")
    print(f"generated: {report['distinct_generated_sequences']} distinct sequences of "
          f"{args.prompts}, {first_tokens} distinct first tokens")
    print("MoE layer | prefill distinct | top-k share | decode distinct (min) | top-k share |"
          " most picked")
    for r in rows:
        print(f"{r.layer:9d} | {r.prefill_distinct_mean:16.1f} | {r.prefill_top_k_share:11.2f} |"
              f" {r.decode_distinct_mean:14.1f} ({r.decode_distinct_min:2d}) |"
              f" {r.decode_top_k_share:11.2f} | {list(r.most_picked)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
