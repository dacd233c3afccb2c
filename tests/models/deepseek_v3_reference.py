#!/usr/bin/python3
"""Independent reference for DeepSeek-V3's attention pieces, in float64 NumPy, written from HuggingFace's
DeepseekV3 definitions (transformers' modeling_deepseek_v3.py: DeepseekV3Attention with rope_interleave, and
modeling_rope_utils.py: _compute_yarn_parameters). Shares no code with moecore.

Usage:
  deepseek_v3_reference.py yarn DIM BASE FACTOR ORIG_MAX BETA_FAST BETA_SLOW MSCALE MSCALE_ALL_DIM
      prints {"inv_freq": [...], "attention_factor": a, "softmax_mscale": m}
  deepseek_v3_reference.py mla CASE.json
      CASE: {"config": {...}, "weights": {hf name: nested list [out][in]}, "x": [B][S][H]}; prints y [B][S][H]

One deliberate divergence from HF, documented where it acts: HF's attention factor falls back to get_mscale(factor)
when mscale_all_dim is 0; Megatron (which moecore follows) uses get_mscale(factor, mscale) / get_mscale(factor,
mscale_all_dim) always. The two agree whenever mscale_all_dim != 0 or mscale == 1 (DeepSeek-V3: both 1).
"""
import json
import math
import sys

import numpy as np


def get_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn(dim, base, factor, orig_max, beta_fast, beta_slow, mscale, mscale_all_dim, truncate=True):
    """HF's _compute_yarn_parameters in float64 (attention factor: Megatron's form, see the module docstring)."""
    attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)

    def find_correction_dim(num_rotations):
        return (dim * math.log(orig_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, attention_factor


def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rotary_interleave(x, cos, sin):
    """HF apply_rotary_pos_emb_interleave: de-interleave the last dim (pairs 2i, 2i+1 -> i, i + d/2), rotate half."""
    *lead, d = x.shape
    x = x.reshape(*lead, d // 2, 2).swapaxes(-1, -2).reshape(*lead, d)
    return x * cos + rotate_half(x) * sin


def mla(case):
    c, w = case["config"], {k: np.array(v, dtype=np.float64) for k, v in case["weights"].items()}
    x = np.array(case["x"], dtype=np.float64)  # [B, S, H]
    B, S, _ = x.shape
    n, dn, dr, dv = c["num_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    dq, eps = dn + dr, c["eps"]
    norm = (lambda t, name: rms_norm(t, w[name], eps)) if c["latent_norms"] else (lambda t, name: t)
    if c["q_lora_rank"]:
        q = norm(x @ w["q_a_proj"].T, "q_a_layernorm") @ w["q_b_proj"].T
    else:
        q = x @ w["q_proj"].T
    q = q.reshape(B, S, n, dq).transpose(0, 2, 1, 3)  # [B, n, S, dq]
    q_pass, q_rot = q[..., :dn], q[..., dn:]
    ckv = x @ w["kv_a_proj_with_mqa"].T
    k_pass, k_rot = ckv[..., : c["kv_lora_rank"]], ckv[..., c["kv_lora_rank"]:]
    kv = (norm(k_pass, "kv_a_layernorm") @ w["kv_b_proj"].T).reshape(B, S, n, dn + dv).transpose(0, 2, 1, 3)
    k_pass, v = kv[..., :dn], kv[..., dn:]
    k_rot = k_rot.reshape(B, 1, S, dr)
    # Rotary tables: emb = [freqs, freqs], times the attention factor (HF's attention_scaling on cos and sin).
    if c["yarn"]:
        inv_freq, af = yarn(dr, c["rope_theta"], c["factor"], c["original_max_position_embeddings"], c["beta_fast"],
                            c["beta_slow"], c["mscale"], c["mscale_all_dim"])
    else:
        inv_freq, af = 1.0 / (c["rope_theta"] ** (np.arange(0, dr, 2, dtype=np.float64) / dr)), 1.0
    freqs = np.outer(np.arange(S, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * af, np.sin(emb) * af
    q_rot, k_rot = apply_rotary_interleave(q_rot, cos, sin), apply_rotary_interleave(k_rot, cos, sin)
    k_rot = np.broadcast_to(k_rot, (B, n, S, dr))
    query = np.concatenate([q_pass, q_rot], axis=-1)
    key = np.concatenate([k_pass, k_rot], axis=-1)
    scaling = dq ** -0.5
    if c["factor"] > 1 and c["mscale_all_dim"]:
        m = get_mscale(c["factor"], c["mscale_all_dim"])
        scaling = scaling * m * m
    scores = query @ key.swapaxes(-1, -2) * scaling
    scores = np.where(np.tril(np.ones((S, S), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(B, S, n * dv)
    return o @ w["o_proj"].T


def main():
    if sys.argv[1] == "yarn":
        a = [float(t) for t in sys.argv[2:]]
        inv_freq, af = yarn(int(a[0]), a[1], a[2], int(a[3]), a[4], a[5], a[6], a[7])
        json.dump({"inv_freq": inv_freq.tolist(), "attention_factor": af, "softmax_mscale": get_mscale(a[2], a[7])},
                  sys.stdout)
    elif sys.argv[1] == "mla":
        json.dump(mla(json.load(open(sys.argv[2]))).tolist(), sys.stdout)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
