#!/usr/bin/python3
"""Independent reference: logits of a HuggingFace Qwen3MoeForCausalLM or MixtralForCausalLM directory, computed
in float64 with NumPy straight from the published architecture definitions (transformers' modeling_qwen3_moe.py
and modeling_mixtral.py) and the safetensors format. Shares no code with moecore.

Usage: hf_reference.py HF_DIR TOKEN_ID... > logits.json   (prints [[logit per vocab entry] per position])
"""
import json
import os
import sys

import numpy as np


# The safetensors reader of the DeepSeek-V3 reference (tests/models/): bf16, f32 and FP8 tensors as float64.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
from deepseek_v3_reference import load_hf_weights as load_weights  # noqa: E402


def rms_norm(x, weight, eps):
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(d, ids):
    c = json.load(open(os.path.join(d, "config.json")))
    w = load_weights(d)
    qwen = c["model_type"] == "qwen3_moe"
    H, L = c["hidden_size"], c["num_hidden_layers"]
    nq = c["num_attention_heads"]
    nkv = c.get("num_key_value_heads", nq)
    D = c.get("head_dim") or H // nq
    eps = c["rms_norm_eps"]
    theta = c.get("rope_theta", 10000.0)
    topk = c["num_experts_per_tok"]
    S = len(ids)

    inv_freq = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    freqs = np.outer(np.arange(S, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)  # [S, D]
    mask = np.triu(np.full((S, S), -np.inf), k=1)

    x = w["model.embed_tokens.weight"][ids]  # [S, H]
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(S, nq, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(S, nkv, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(S, nkv, D)
        if qwen:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
        k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
        rep = nq // nkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        att = np.einsum("snd,tnd->nst", q, k) / np.sqrt(D) + mask
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att /= att.sum(axis=-1, keepdims=True)
        o = np.einsum("nst,tnd->snd", att, v).reshape(S, nq * D)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T

        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        dense = False
        if qwen:
            step = c.get("decoder_sparse_step", 1)
            dense = i in c.get("mlp_only_layers", []) or c["num_experts"] == 0 or (i + 1) % step != 0
        if dense:
            m = p + "mlp."
            y = (silu(h @ w[m + "gate_proj.weight"].T) * (h @ w[m + "up_proj.weight"].T)) @ w[m + "down_proj.weight"].T
        else:
            m = p + ("mlp." if qwen else "block_sparse_moe.")
            logits = h @ w[m + "gate.weight"].T  # [S, E]
            probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            y = np.zeros_like(h)
            for s in range(S):
                sel = np.argsort(-probs[s], kind="stable")[:topk]
                wts = probs[s, sel]
                if (not qwen) or c.get("norm_topk_prob", False):
                    wts = wts / wts.sum()
                for e, g in zip(sel, wts):
                    ex = f"{m}experts.{e}."
                    if qwen:
                        gw, uw, dw = ex + "gate_proj.weight", ex + "up_proj.weight", ex + "down_proj.weight"
                    else:
                        gw, uw, dw = ex + "w1.weight", ex + "w3.weight", ex + "w2.weight"
                    a = silu(w[gw] @ h[s]) * (w[uw] @ h[s])
                    y[s] += g * (w[dw] @ a)
        x = x + y
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.T


if __name__ == "__main__":
    print(json.dumps(forward(sys.argv[1], [int(t) for t in sys.argv[2:]]).tolist()))
