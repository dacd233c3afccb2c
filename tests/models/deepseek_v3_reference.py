#!/usr/bin/python3
"""Independent reference for DeepSeek-V3, in float64 NumPy, written from HuggingFace's DeepseekV3 definitions
(transformers' modeling_deepseek_v3.py: DeepseekV3Attention with rope_interleave, DeepseekV3TopkRouter / DeepseekV3MoE,
and modeling_rope_utils.py: _compute_yarn_parameters), DeepSeek-V3's inference/fp8_cast_bf16.py (block FP8 weights)
and Megatron-Core's MultiTokenPredictionBlock (MTP). Shares no code with moecore.

Usage:
  deepseek_v3_reference.py yarn DIM BASE FACTOR ORIG_MAX BETA_FAST BETA_SLOW MSCALE MSCALE_ALL_DIM
      prints {"inv_freq": [...], "attention_factor": a, "softmax_mscale": m}
  deepseek_v3_reference.py mla CASE.json
      CASE: {"config": {...}, "weights": {hf name: nested list [out][in]}, "x": [B][S][H]}; prints y [B][S][H]
  deepseek_v3_reference.py model HF_DIR ID_0 ID_1 ... ID_S
      HF_DIR: config.json + model.safetensors (or model.safetensors.index.json + shards), tensors BF16, F32 or
      F8_E4M3 (an F8 `X.weight` [M, N] comes with F32 `X.weight_scale_inv` [ceil(M/bm), ceil(N/bn)] and means
      fp8[i, j] * scale_inv[i // bm, j // bn], DeepSeek's weight_dequant; [bm, bn]: quantization_config's
      weight_block_size, default [128, 128]). One causal sequence: inputs ids[0:S],
      labels ids[1:S+1]. Prints
      {"logits": [S][V], "mtp_logits": [D][S][V], "lm_loss": float, "mtp_losses": [D floats]}
      with D = num_nextn_predict_layers (0 when absent: both mtp lists empty) and losses the mean token
      cross-entropy.

Main model: HF DeepseekV3ForCausalLM. Layers i < first_k_dense_replace have a dense SwiGLU FFN, the rest the noaux_tc
MoE: s = sigmoid(router logits), choice c = s + e_score_correction_bias, group score = sum of the group's top-2 c,
keep the topk_group best groups, c outside them set to 0.0 (HF's masked_fill value; DeepSeek's inference/model.py
uses -inf, which differs only when some kept c < 0), take the num_experts_per_tok largest c (ties: lowest index),
weight them by s (not c), normalise (sum + 1e-20) if norm_topk_prob, times routed_scaling_factor; plus the shared
experts.

MTP, depth k = 1..D, stored HF-style as layer L+k-1 (`model.layers.61.*` for DeepSeek-V3's L = 61):
  tok_k = ids[0:S] rolled left by k with the tail zero-filled (Megatron's roll_tensor; token id 0);
  z = [enorm(embed_tokens[tok_k]), hnorm(h_{k-1})] @ eh_proj.T   (embedding half first, as in Megatron);
  z = decoder layer L+k-1 (MLA + MoE, or dense if L+k-1 < first_k_dense_replace);
  h_k = shared_head.norm(z);  mtp_logits_k = h_k @ lm_head.T;
  mtp_losses[k-1] = mean over s < S-k of CE(mtp_logits_k[s], ids[s+k+1]) (rolled labels past the end are masked).
The layer's own embed_tokens / shared_head.head, where stored, must equal the main embedding / lm_head (moecore
shares them), else this script fails. h_0 is the main model's *final-normed* state (model.norm(x), the input of
lm_head), not the last layer's raw residual stream: Megatron's TransformerBlock applies the decoder's final layernorm
before GPTModel hands its output to the MTP block. HF itself has no MTP (it ignores `model.layers.61.*`). The MTP
layers' RoPE uses positions 0..S-1 like the main layers (Megatron also rolls position_ids, but those feed only learned
absolute embeddings, which DeepSeek-V3 has none of).

One deliberate divergence from HF, documented where it acts: HF's attention factor falls back to get_mscale(factor)
when mscale_all_dim is 0; Megatron (which moecore follows) uses get_mscale(factor, mscale) / get_mscale(factor,
mscale_all_dim) always. The two agree whenever mscale_all_dim != 0 or mscale == 1 (DeepSeek-V3: both 1).
"""
import json
import math
import os
import struct
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


def mla_attention(c, weight, x):
    """DeepseekV3Attention on x [..., S, H] (causal, positions 0..S-1). c: the `mla` CASE config keys; weight(name)
    returns the [out, in] matrix (or norm vector) for a short HF name such as "q_a_proj" or "kv_a_layernorm"."""
    x = np.asarray(x, dtype=np.float64)
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    B, S, _ = x.shape
    n, dn, dr, dv = c["num_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    dq, eps = dn + dr, c["eps"]
    norm = (lambda t, name: rms_norm(t, weight(name), eps)) if c["latent_norms"] else (lambda t, name: t)
    if c["q_lora_rank"]:
        q = norm(x @ weight("q_a_proj").T, "q_a_layernorm") @ weight("q_b_proj").T
    else:
        q = x @ weight("q_proj").T
    q = q.reshape(B, S, n, dq).transpose(0, 2, 1, 3)  # [B, n, S, dq]
    q_pass, q_rot = q[..., :dn], q[..., dn:]
    ckv = x @ weight("kv_a_proj_with_mqa").T
    k_pass, k_rot = ckv[..., : c["kv_lora_rank"]], ckv[..., c["kv_lora_rank"]:]
    kv = (norm(k_pass, "kv_a_layernorm") @ weight("kv_b_proj").T).reshape(B, S, n, dn + dv).transpose(0, 2, 1, 3)
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
    y = o @ weight("o_proj").T
    return y[0] if squeeze else y


def mla(case):
    w = {k: np.array(v, dtype=np.float64) for k, v in case["weights"].items()}
    return mla_attention(case["config"], lambda name: w[name], case["x"])


# ---------------------------------------------------------------------------------------------------------------
# Whole model: HF DeepseekV3ForCausalLM plus Megatron-style MTP depths, read from a HF directory.
# ---------------------------------------------------------------------------------------------------------------
def _fp8_e4m3_table():
    """float8 e4m3fn decode table: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
    (m/8 * 2^-6); no infinities; 0x7F and 0xFF are NaN."""
    t = np.empty(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = sign * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


FP8_E4M3 = _fp8_e4m3_table()


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        if e["dtype"] == "BF16":
            x = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F32":
            x = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "F8_E4M3":
            x = FP8_E4M3[np.frombuffer(raw, dtype=np.uint8)]
        else:
            raise SystemExit(f"{path}: {name}: unsupported dtype {e['dtype']}")
        out[name] = (x.astype(np.float64).reshape(e["shape"]), e["dtype"])
    return out


def dequant_block(w, scale_inv, block=(128, 128)):
    """DeepSeek's weight_dequant: w[i, j] * scale_inv[i // block[0], j // block[1]]."""
    M, N = w.shape
    want = (-(-M // block[0]), -(-N // block[1]))
    if scale_inv.shape != want:
        raise SystemExit(f"weight_scale_inv shape {scale_inv.shape}, expected {want} for a [{M}, {N}] weight")
    return w * np.repeat(np.repeat(scale_inv, block[0], axis=0), block[1], axis=1)[:M, :N]


def load_hf_weights(d):
    # quantization_config.weight_block_size (DeepSeek-V3: [128, 128]).
    q = json.load(open(os.path.join(d, "config.json"))).get("quantization_config") or {}
    block = tuple(q.get("weight_block_size", (128, 128)))
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    raw = {}
    for f in files:
        raw.update(read_safetensors(os.path.join(d, f)))
    w = {}
    for name, (x, dtype) in raw.items():
        if name.endswith("_scale_inv"):
            continue
        if dtype == "F8_E4M3":
            s = name + "_scale_inv"
            if s not in raw:
                raise SystemExit(f"{name} is F8_E4M3 but {s} is missing")
            x = dequant_block(x, raw[s][0], block)
        w[name] = x
    for name in raw:
        if name.endswith("_scale_inv") and name[: -len("_scale_inv")] not in raw:
            raise SystemExit(f"{name} has no weight")
    return w


def read_config(d):
    """HF DeepseekV3Config keys, with its defaults where a key is absent."""
    c = json.load(open(os.path.join(d, "config.json")))
    defaults = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                    num_hidden_layers=61, num_attention_heads=128, n_shared_experts=1, n_routed_experts=256,
                    routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                    v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
                    first_k_dense_replace=3, norm_topk_prob=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
                    rope_theta=10000.0, rope_scaling=None, tie_word_embeddings=False, num_nextn_predict_layers=0)
    for k, v in defaults.items():
        c.setdefault(k, v)
    if c.get("hidden_act", "silu") != "silu":
        raise SystemExit(f"hidden_act {c['hidden_act']} unsupported")
    if c.get("rope_interleave", True) is not True:
        raise SystemExit("rope_interleave false unsupported")
    if c.get("attention_bias", False):
        raise SystemExit("attention_bias unsupported")
    rs = c["rope_scaling"]
    att = dict(num_heads=c["num_attention_heads"], q_lora_rank=c["q_lora_rank"], kv_lora_rank=c["kv_lora_rank"],
               qk_nope_head_dim=c["qk_nope_head_dim"], qk_rope_head_dim=c["qk_rope_head_dim"],
               v_head_dim=c["v_head_dim"], eps=c["rms_norm_eps"], latent_norms=True, rope_theta=c["rope_theta"])
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind != "yarn":
            raise SystemExit(f"rope_scaling type {kind} unsupported")
        att.update(yarn=True, factor=float(rs["factor"]),
                   original_max_position_embeddings=rs.get("original_max_position_embeddings")
                   or c["max_position_embeddings"],
                   beta_fast=float(rs.get("beta_fast", 32)), beta_slow=float(rs.get("beta_slow", 1)),
                   mscale=float(rs.get("mscale", 1)), mscale_all_dim=float(rs.get("mscale_all_dim", 0)))
    else:
        att.update(yarn=False, factor=1.0, mscale=1.0, mscale_all_dim=0.0)
    c["attention"] = att
    return c


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu(w, p, h):
    return (silu(h @ w[p + "gate_proj.weight"].T) * (h @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def route(logits, bias, c):
    """HF DeepseekV3TopkRouter (noaux_tc) for router logits [T, E]: returns (expert ids [T, K], weights [T, K]).
    Ties go to the lowest index (stable sorts)."""
    E, G, K = c["n_routed_experts"], c["n_group"], c["num_experts_per_tok"]
    s = 1.0 / (1.0 + np.exp(-logits))
    choice = s + bias
    T = choice.shape[0]
    grouped = choice.reshape(T, G, E // G)
    group_scores = -np.sort(-grouped, axis=-1)[..., :2].sum(axis=-1)  # sum of the top-2 per group
    keep = np.zeros((T, G), dtype=bool)
    best = np.argsort(-group_scores, axis=-1, kind="stable")[:, : c["topk_group"]]
    np.put_along_axis(keep, best, True, axis=-1)
    masked = np.where(np.repeat(keep, E // G, axis=-1), choice, 0.0)  # HF masked_fill(~mask, 0.0)
    idx = np.argsort(-masked, axis=-1, kind="stable")[:, :K]
    wts = np.take_along_axis(s, idx, axis=-1)
    if c["norm_topk_prob"]:
        wts = wts / (wts.sum(axis=-1, keepdims=True) + 1e-20)
    return idx, wts * c["routed_scaling_factor"]


def moe(w, p, h, c):
    idx, wts = route(h @ w[p + "gate.weight"].T, w[p + "gate.e_score_correction_bias"], c)
    y = np.zeros_like(h)
    for t in range(h.shape[0]):
        for e, g in zip(idx[t], wts[t]):
            y[t] += g * swiglu(w, f"{p}experts.{e}.", h[t:t + 1])[0]
    if c["n_shared_experts"]:
        y = y + swiglu(w, p + "shared_experts.", h)
    return y


def decoder_layer(w, c, i, x):
    """HF DeepseekV3DecoderLayer i on x [S, H]."""
    p, eps = f"model.layers.{i}.", c["rms_norm_eps"]
    x = x + mla_attention(c["attention"], lambda n: w[f"{p}self_attn.{n}.weight"],
                          rms_norm(x, w[p + "input_layernorm.weight"], eps))
    h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
    return x + (moe(w, p + "mlp.", h, c) if i >= c["first_k_dense_replace"] else swiglu(w, p + "mlp.", h))


def cross_entropy(logits, labels):
    z = logits - logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))
    return float(np.mean(lse - z[np.arange(len(labels)), labels]))


def model(d, ids):
    c, w = read_config(d), load_hf_weights(d)
    ids = np.asarray(ids, dtype=np.int64)
    S, L, D, eps = len(ids) - 1, c["num_hidden_layers"], c["num_nextn_predict_layers"] or 0, c["rms_norm_eps"]
    if S < 1 or S <= D:
        raise SystemExit(f"need more than max(0, D={D}) input tokens plus one label; got {len(ids)} ids")
    inputs = ids[:S]
    embed = w["model.embed_tokens.weight"]
    head = embed if c["tie_word_embeddings"] else w["lm_head.weight"]
    x = embed[inputs]
    for i in range(L):
        x = decoder_layer(w, c, i, x)
    h = rms_norm(x, w["model.norm.weight"], eps)  # h_0: Megatron's decoder applies its final layernorm first
    logits = h @ head.T
    out = {"logits": logits.tolist(), "mtp_logits": [], "lm_loss": cross_entropy(logits, ids[1:]), "mtp_losses": []}
    for k in range(1, D + 1):
        i = L + k - 1
        p = f"model.layers.{i}."
        for own, main_w in ((p + "embed_tokens.weight", embed), (p + "shared_head.head.weight", head)):
            if own in w and not np.array_equal(w[own], main_w):
                raise SystemExit(f"{own} differs from the main model's; moecore shares them")
        tok = np.zeros(S, dtype=np.int64)
        tok[: S - k] = inputs[k:]  # Megatron roll_tensor: shift left by k, zero-fill the tail
        e = rms_norm(embed[tok], w[p + "enorm.weight"], eps)
        z = np.concatenate([e, rms_norm(h, w[p + "hnorm.weight"], eps)], axis=-1) @ w[p + "eh_proj.weight"].T
        h = rms_norm(decoder_layer(w, c, i, z), w[p + "shared_head.norm.weight"], eps)
        mtp_logits = h @ head.T
        out["mtp_logits"].append(mtp_logits.tolist())
        out["mtp_losses"].append(cross_entropy(mtp_logits[: S - k], ids[k + 1:]))
    return out


def main():
    if sys.argv[1] == "yarn":
        a = [float(t) for t in sys.argv[2:]]
        inv_freq, af = yarn(int(a[0]), a[1], a[2], int(a[3]), a[4], a[5], a[6], a[7])
        json.dump({"inv_freq": inv_freq.tolist(), "attention_factor": af, "softmax_mscale": get_mscale(a[2], a[7])},
                  sys.stdout)
    elif sys.argv[1] == "mla":
        json.dump(mla(json.load(open(sys.argv[2]))).tolist(), sys.stdout)
    elif sys.argv[1] == "model":
        json.dump(model(sys.argv[2], [int(t) for t in sys.argv[3:]]), sys.stdout)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
