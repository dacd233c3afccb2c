#!/usr/bin/env python3
"""Megatron-LM's theoretical memory estimate (megatron/training/theoretical_memory_usage.py) for a recipe, beside
the same estimate with expert parallelism counted, so `moecore plan` can be compared with it line by line
(docs/performance.md). Written from the estimator's formulas: bytes per parameter 18, or 6 + 12/DP with the
distributed optimizer, on the most loaded shard ((transformer block / PP + MTP block + embedding) / TP); activations
S·B·H·(18 + 4·F/H) per layer for all layers (the first stage holds PP micro-batches of L/PP layers), times the
interleaved schedule's penalty 1 + (PP − 1)/(PP·VPP), divided by TP (sequence parallelism, selective recompute).

The estimator has no expert-parallel term: every rank is counted with all experts of its layers. The "with EP"
column divides the routed experts by EP and shards their optimizer state over the expert-data-parallel ranks, as
Megatron's distributed optimizer does.

Usage: scripts/megatron_memory_estimate.py [--recipe deepseek-v3]
"""
import argparse

GIB = 2.0**30

RECIPES = {
    # Megatron-Bridge's DeepSeek-V3 H100 BF16 pretraining recipe on 1,024 GPUs (issue 44's flags).
    "deepseek-v3": dict(
        layers=61, hidden=7168, heads=128, q_lora=1536, kv_lora=512, qk_head=128, qk_pos=64, v_head=128,
        ffn=18432, experts=256, moe_ffn=2048, shared_ffn=2048, dense_layers=3, mtp_layers=1, vocab=129280,
        seq=4096, micro_batch=1, world=1024, tp=2, pp=8, vpp=4, ep=64, etp=1, distributed_optimizer=True,
        rmsnorm=True, untied=True),
}


def parameters(r):
    """Parameters of a dense layer, a MoE layer's non-expert part and its routed experts, as the estimator counts
    them (MLA with a q LoRA; SwiGLU; RMSNorm)."""
    H, N = r["hidden"], r["heads"]
    norm = 1 if r["rmsnorm"] else 2
    q = r["q_lora"] * (H + N * (r["qk_head"] + r["qk_pos"]) + norm)
    attn = q + r["kv_lora"] * (H + N * (r["qk_head"] + r["v_head"]) + norm) + H * r["qk_pos"] + N * r["v_head"] * H
    glu = 3 / 2
    dense = 2 * H * (r["ffn"] * glu + norm) + attn
    moe_rest = 2 * H * (r["shared_ffn"] * glu + norm) + attn
    experts = 2 * H * r["moe_ffn"] * r["experts"] * glu
    return dense, moe_rest, experts


def estimate(r, with_ep):
    dense, moe_rest, experts = parameters(r)
    L, D = r["layers"], r["dense_layers"]
    moe_layers = L - D
    H, V = r["hidden"], r["vocab"]
    norm = 1 if r["rmsnorm"] else 2
    dp = r["world"] // (r["tp"] * r["pp"])
    edp = r["world"] // (r["ep"] * r["etp"] * r["pp"])
    ep = r["ep"]
    block_dense = dense * D + moe_rest * moe_layers + norm * H
    block_experts = experts * moe_layers
    mtp_dense, mtp_experts = moe_rest * r["mtp_layers"], experts * r["mtp_layers"]
    embedding = H * V
    tp, pp = r["tp"], r["pp"]
    shard_dense = (block_dense / pp + mtp_dense + embedding) / tp
    # As the estimator: every shard split over TP; with EP counted, routed experts over EP × ETP instead.
    shard_experts = (block_experts / pp + mtp_experts) / (ep * r["etp"] if with_ep else tp)
    if not r["distributed_optimizer"]:
        per_dense = per_expert = 18
    else:
        per_dense = 6 + 12 / dp
        per_expert = 6 + 12 / (edp if with_ep else dp)
    weights_optimizer = shard_dense * per_dense + shard_experts * per_expert
    n = shard_dense + shard_experts
    # The 6 (or 18) bytes taken apart: bf16 weights 2, fp32 gradients 4, fp32 master and two moments 12 (/DP).
    split = dict(weights=2 * n, grads=4 * n, optimizer=weights_optimizer - 6 * n)
    S, B = r["seq"], r["micro_batch"]
    act = S * B * H * (18 + 4 * r["ffn"] / H) * L
    act += 8 * S * B * pp + S * B * H * pp
    penalty = 1 + (pp - 1) / (pp * r["vpp"])
    act *= penalty
    act /= tp
    return dict(**split, params=shard_dense + shard_experts, bytes_per_param=weights_optimizer / (shard_dense + shard_experts),
                weights_optimizer=weights_optimizer, activations=act, penalty=penalty)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="deepseek-v3", choices=sorted(RECIPES))
    a = ap.parse_args()
    r = RECIPES[a.recipe]
    print(f"Megatron's theoretical memory estimate for {a.recipe}: TP {r['tp']} PP {r['pp']} VPP {r['vpp']} "
          f"EP {r['ep']} on {r['world']} ranks, micro-batch {r['micro_batch']} x {r['seq']}")
    print(f"{'':34} {'as Megatron computes':>22} {'with EP counted':>18}")
    m, e = estimate(r, False), estimate(r, True)
    rows = [("parameters on the most loaded rank", lambda x: f"{x['params'] / 1e9:.3f} B"),
            ("bytes per parameter", lambda x: f"{x['bytes_per_param']:.3f}"),
            ("  bf16 weights", lambda x: f"{x['weights'] / GIB:.2f} GiB"),
            ("  fp32 gradients", lambda x: f"{x['grads'] / GIB:.2f} GiB"),
            ("  fp32 master + moments", lambda x: f"{x['optimizer'] / GIB:.2f} GiB"),
            ("weights + optimizer", lambda x: f"{x['weights_optimizer'] / GIB:.2f} GiB"),
            ("activations (interleaving penalty)", lambda x: f"{x['activations'] / GIB:.2f} GiB ({x['penalty']:.3f})"),
            ("total", lambda x: f"{(x['weights_optimizer'] + x['activations']) / GIB:.2f} GiB")]
    for name, f in rows:
        print(f"{name:34} {f(m):>22} {f(e):>18}")


if __name__ == "__main__":
    main()
