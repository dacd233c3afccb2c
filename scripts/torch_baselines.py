#!/usr/bin/env python3
"""PyTorch reference figures for moecore's GPU benchmarks, measured on the same GPU in the same run.

Each line printed is `REF <name> <value> <unit>` so scripts/gpu-test.sh can collect them.
  peak       cuBLAS bf16 GEMM (torch.mm, 8192^3, random data): the ratio denominator
  sdpa       F.scaled_dot_product_attention causal, forward+backward (the `bench attention` shapes)
  moe        one MoE layer forward+backward (router, permutation, fc1, SwiGLU, fc2, weighted combine), experts as a
             per-expert loop and as torch._grouped_mm, for the Qwen3-30B-A3B and Mixtral shapes of `bench moe-layer`
  hf-train   a HuggingFace Qwen3MoeForCausalLM training step (bf16, AdamW) on the `bench train --model qwen3-moe-gpu`
             shape: tokens/s
Usage: torch_baselines.py [peak] [sdpa] [moe] [hf-train]   (none: all)
"""
import statistics
import sys

import torch
import torch.nn.functional as F


def bench(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def ref(name, value, unit):
    print(f"REF {name} {value:.6g} {unit}", flush=True)


def peak():
    n = 8192
    sets = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, n, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
    i = [0]

    def mm():
        a, b = sets[i[0] % 3]
        i[0] += 1
        return a @ b

    t = bench(mm, 5, 20)
    ref("cublas_bf16_peak", 2 * n**3 / t / 1e12, "TFLOP/s")


def sdpa():
    S, N, D = 4096, 16, 128
    for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        q = torch.randn(1, N, S, D, device="cuda", dtype=dt, requires_grad=True)
        k = torch.randn_like(q, requires_grad=True)
        v = torch.randn_like(q, requires_grad=True)
        do = torch.randn_like(q)

        def step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)

        t = bench(step, 2, 5)
        flops = 3.5 * 4.0 * S * S * D * N / 2  # causal: forward 2 GEMMs, backward 5, half the square
        ref(f"sdpa_{tag}_ms", t * 1e3, "ms")
        ref(f"sdpa_{tag}", flops / t / 1e12, "TFLOP/s")
    # The Qwen3-MoE step's attention: 32 query heads over 4 kv heads (bench attention's GQA shape).
    Nq, Nkv = 32, 4
    q = torch.randn(1, Nq, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, Nkv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    do = torch.randn_like(q)

    def gqa_step():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o.backward(do)

    t = bench(gqa_step, 2, 5)
    ref("sdpa_bf16_gqa32_4", 3.5 * 4.0 * S * S * D * Nq / 2 / t / 1e12, "TFLOP/s")


class MoE(torch.nn.Module):
    """Megatron's MoE layer in plain PyTorch: softmax router with top-k, tokens sorted expert-major, SwiGLU experts."""

    def __init__(self, H, F_, E, k, grouped):
        super().__init__()
        self.E, self.k, self.F, self.grouped = E, k, F_, grouped
        dt = torch.bfloat16
        self.router = torch.nn.Parameter(torch.randn(E, H, device="cuda", dtype=torch.float32) * 0.02)
        self.fc1 = torch.nn.Parameter(torch.randn(E, H, 2 * F_, device="cuda", dtype=dt) * 0.02)
        self.fc2 = torch.nn.Parameter(torch.randn(E, F_, H, device="cuda", dtype=dt) * 0.02)

    def forward(self, x):
        T, H = x.shape
        logits = x.float() @ self.router.t()
        probs, ids = torch.topk(torch.softmax(logits, dim=-1), self.k, dim=-1)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        xs = x[order // self.k]
        if self.grouped:
            offs = torch.cumsum(counts, 0).to(torch.int32)
            h = torch._grouped_mm(xs, self.fc1, offs=offs)
            a, g = h.chunk(2, dim=-1)
            y = torch._grouped_mm(F.silu(a) * g, self.fc2, offs=offs)
        else:
            outs = []
            for e, part in enumerate(torch.split(xs, counts.tolist())):
                a, g = (part @ self.fc1[e]).chunk(2, dim=-1)
                outs.append((F.silu(a) * g) @ self.fc2[e])
            y = torch.cat(outs)
        w = probs.reshape(-1)[order].unsqueeze(1).to(y.dtype)
        out = torch.zeros_like(x)
        out.index_add_(0, order // self.k, y * w)
        return out


def moe():
    shapes = [("qwen3_30b_a3b", 2048, 768, 128, 8, 16384), ("mixtral", 4096, 14336, 8, 2, 16384)]
    for name, H, F_, E, k, T in shapes:
        flops = 3 * T * k * 6 * H * F_  # forward + backward of fc1 (H→2F) and fc2 (F→H)
        for variant in ("loop", "grouped_mm"):
            torch.manual_seed(0)
            try:
                layer = MoE(H, F_, E, k, variant == "grouped_mm")
                x = (torch.randn(T, H, device="cuda", dtype=torch.bfloat16) * 0.5).requires_grad_()
                dy = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)

                def step():
                    layer(x).backward(dy)

                t = bench(step, 2, 5)
                ref(f"moe_{name}_{variant}_ms", t * 1e3, "ms")
                ref(f"moe_{name}_{variant}", flops / t / 1e12, "TFLOP/s")
            except Exception as e:  # report and go on: one failing variant must not hide the others
                print(f"REF moe_{name}_{variant} failed: {type(e).__name__}: {e}", flush=True)
            finally:
                layer = x = None
                torch.cuda.empty_cache()


def hf_train():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=32768, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                         num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                         num_experts=64, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=4096,
                         decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1e6, rms_norm_eps=1e-6,
                         router_aux_loss_coef=0.001, output_router_logits=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    B, S = 4, 4096
    ids = torch.randint(0, cfg.vocab_size, (B, S), device="cuda")

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = bench(step, 2, 4)
    n_params = sum(p.numel() for p in model.parameters())
    ref("hf_qwen3moe_params", n_params, "")
    ref("hf_qwen3moe_step_ms", t * 1e3, "ms")
    ref("hf_qwen3moe_tokens_per_s", B * S / t, "tok/s")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("torch_baselines: no CUDA GPU visible to PyTorch")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    parts = sys.argv[1:] or ["peak", "sdpa", "moe", "hf-train"]
    for p in parts:
        try:
            {"peak": peak, "sdpa": sdpa, "moe": moe, "hf-train": hf_train}[p]()
        except Exception as e:
            print(f"REF {p} failed: {type(e).__name__}: {e}", flush=True)
