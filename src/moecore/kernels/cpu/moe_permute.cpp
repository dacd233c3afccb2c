// The MoE permutation on the CPU (see kernels/moe_permute.h): the plan by counting sort (rows expert-major, ascending
// token inside an expert, each expert's rows from a multiple of row_align), row copies in threads over rows, and the
// per-token sums in threads over tokens, each token's rows added in ascending order (the same bits for any thread
// count).
#include "moecore/kernels/cpu/moe_permute.h"

#include <algorithm>
#include <cstring>

#include "moecore/core/cpu.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

namespace {

inline float widen_row(bf16 v) {
  return bf16_to_float(v);
}
inline float widen_row(f16 v) {
  return f16_to_float(v);
}
inline void round_into(float v, bf16& out) {
  out = float_to_bf16(v);
}
inline void round_into(float v, f16& out) {
  out = float_to_f16(v);
}
template <typename F>
inline F widen_row(F v) {
  return v;
}

// out[t] = Σ rows of t in ascending order, in D (bf16 rows S widened as they are read); vectorized per ISA.
template <typename S, typename D>
MOE_ALWAYS_INLINE void sum_token_rows_body(const S* src, const int64_t* off, const int32_t* rows, int64_t T, int64_t H,
                                           D* dst) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < T; t++) {
    D* out = dst + t * H;
#pragma omp simd
    for (int64_t h = 0; h < H; h++) out[h] = 0;
    for (int64_t i = off[t]; i < off[t + 1]; i++) {
      const S* in = src + static_cast<int64_t>(rows[i]) * H;
#pragma omp simd
      for (int64_t h = 0; h < H; h++) out[h] += widen_row(in[h]);
    }
  }
}
template <typename S, typename D>
void sum_token_rows(const S* src, const int64_t* off, const int32_t* rows, int64_t T, int64_t H, D* dst) {
#pragma omp parallel
  MOE_CPU_CLONES(sum_token_rows_body<S, D>(src, off, rows, T, H, dst));
}

// d[r] = bf16(s[tok[r]]) or f16(s[tok[r]]) (zero where tok[r] < 0), vectorized as the casts are.
template <typename O>
MOE_ALWAYS_INLINE void gather_rounded_rows_body(const float* s, const int32_t* tok, int64_t R, int64_t H, O* d) {
#pragma omp for schedule(static)
  for (int64_t r = 0; r < R; r++) {
    O* out = d + r * H;
    if (tok[r] < 0) {
      std::fill_n(out, H, O{0});
      continue;
    }
    const float* in = s + tok[r] * H;
#pragma omp simd
    for (int64_t h = 0; h < H; h++) round_into(in[h], out[h]);
  }
}
template <typename O>
void gather_rounded_rows(const float* s, const int32_t* tok, int64_t R, int64_t H, O* d) {
#pragma omp parallel
  MOE_CPU_CLONES(gather_rounded_rows_body<O>(s, tok, R, H, d));
}

// dst[i] = src[at[i]] (gather: 0 where at[i] < 0) or dst[at[i]] = src[i] (scatter: none where at[i] < 0), for
// i < n, in src's dtype when dst has it (else through doubles).
template <bool Scatter>
void move_values(const Tensor& src, const int64_t* at, int64_t n, Tensor& dst) {
  if (src.dtype() != dst.dtype()) {
    for (int64_t i = 0; i < n; i++) {
      if constexpr (Scatter) {
        if (at[i] >= 0) dst.set_item(at[i], src.item(i));
      } else {
        dst.set_item(i, at[i] >= 0 ? src.item(at[i]) : 0.0);
      }
    }
    return;
  }
  MOE_DISPATCH_FLOAT(src.dtype(), F, {
    const F* s = src.data<F>();
    F* d = dst.data<F>();
    for (int64_t i = 0; i < n; i++) {
      if constexpr (Scatter) {
        if (at[i] >= 0) d[at[i]] = s[i];
      } else {
        d[i] = at[i] >= 0 ? s[at[i]] : F(0);
      }
    }
  });
}

}  // namespace

void moe_permute_plan(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t block, int64_t row_align,
                      PermutePlan& plan) {
  const int64_t T = idx_TK.dim(0), K = idx_TK.dim(1);
  MOE_ASSERT(row_align >= 1 && idx_TK.dtype() == DType::I32);
  MOE_ASSERT(pad_capacity == 0 || (block > 0 && T % block == 0));
  const int32_t* id = idx_TK.data<int32_t>();
  auto mine = [&](int64_t i) { return id[i] >= 0 && id[i] < E; };
  // j of token t's choice of expert e, or −1 (an expert appears at most once among a token's K choices).
  auto choice = [&](int64_t t, int64_t e) {
    for (int64_t j = 0; j < K; j++)
      if (id[t * K + j] == e) return j;
    return int64_t{-1};
  };
  plan.tokens_per_expert.assign(static_cast<size_t>(E), 0);
  plan.token_offsets_T1 = Tensor::zeros({T + 1}, DType::I64);
  int64_t* off = plan.token_offsets_T1.data<int64_t>();
  auto& tpe = plan.tokens_per_expert;
  // Rows per expert and per token (off[t + 1]); under padding, each expert is filled to pad_capacity per block
  // with the earliest tokens that have no row for it.
  for (int64_t i = 0; i < T * K; i++)
    if (mine(i)) {
      tpe[static_cast<size_t>(id[i])]++;
      off[i / K + 1]++;
    }
  auto pad_walk = [&](int64_t e, auto&& row) {  // calls row(t, j or −1) for expert e's rows, ascending t
    for (int64_t b0 = 0; b0 < T; b0 += block) {
      int64_t have = 0;
      for (int64_t t = b0; t < b0 + block; t++) have += choice(t, e) >= 0;
      MOE_ASSERT(have <= pad_capacity);
      int64_t need = pad_capacity - have;
      for (int64_t t = b0; t < b0 + block; t++) {
        const int64_t j = choice(t, e);
        if (j >= 0) {
          row(t, j);
        } else if (need > 0) {
          row(t, int64_t{-1});
          need--;
        }
      }
    }
  };
  if (pad_capacity > 0)
    for (int64_t e = 0; e < E; e++)
      pad_walk(e, [&](int64_t t, int64_t j) {
        if (j < 0) {
          tpe[static_cast<size_t>(e)]++;
          off[t + 1]++;
        }
      });
  int64_t R = 0, Rp = 0;  // rows, and rows in the padded layout
  for (int64_t c : tpe) R += c, Rp += align_up(c, row_align);
  plan.R = Rp;
  for (int64_t t = 0; t < T; t++) off[t + 1] += off[t];
  // Sized for the most rows the padded layout can take: the same allocation every step however the rows fall.
  plan.row_token_R = padded_rows_empty(R, E, row_align, Rp, 1, DType::I32).reshape({Rp});
  plan.row_tk_R = padded_rows_empty(R, E, row_align, Rp, 1, DType::I64).reshape({Rp});
  plan.token_rows = Tensor::empty({R}, DType::I32);
  int32_t* rt = plan.row_token_R.data<int32_t>();
  int64_t* rtk = plan.row_tk_R.data<int64_t>();
  // Expert-major, ascending token inside an expert; expert e's rows start at pad_start[e] (gap rows: −1).
  auto& pad_start = plan.expert_offsets;
  pad_start.assign(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; e++)
    pad_start[static_cast<size_t>(e + 1)] =
        pad_start[static_cast<size_t>(e)] + align_up(tpe[static_cast<size_t>(e)], row_align);
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = pad_start[static_cast<size_t>(e)] + tpe[static_cast<size_t>(e)];
         r < pad_start[static_cast<size_t>(e + 1)]; r++)
      rt[r] = -1, rtk[r] = -1;
  if (pad_capacity > 0) {
    for (int64_t e = 0; e < E; e++) {
      int64_t r = pad_start[static_cast<size_t>(e)];
      pad_walk(e, [&](int64_t t, int64_t j) {
        rt[r] = static_cast<int32_t>(t);
        rtk[r] = j >= 0 ? t * K + j : -1;
        r++;
      });
      MOE_ASSERT(r == pad_start[static_cast<size_t>(e)] + tpe[static_cast<size_t>(e)]);
    }
  } else {  // counting sort: pad_start[e] runs from expert e's first row to its end
    for (int64_t i = 0; i < T * K; i++)
      if (mine(i)) {
        const int64_t r = pad_start[static_cast<size_t>(id[i])]++;
        rt[r] = static_cast<int32_t>(i / K);
        rtk[r] = i;
      }
  }
  // Each token's rows in ascending expert order (rows are expert-major).
  plan.token_cursor_T = Tensor::empty({std::max<int64_t>(T, 1)}, DType::I64);
  int64_t* cur = plan.token_cursor_T.data<int64_t>();
  std::copy(off, off + T, cur);
  int32_t* trows = plan.token_rows.data<int32_t>();
  for (int64_t r = 0; r < Rp; r++)
    if (rt[r] >= 0) trows[cur[rt[r]]++] = static_cast<int32_t>(r);
}

void moe_gather_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst) {
  const int64_t R = idx_R.numel(), H = src.cols();
  MOE_ASSERT(dst.rows() == R && dst.cols() == H && idx_R.dtype() == DType::I32);
  const int32_t* tok = idx_R.data<int32_t>();
  if (dst.dtype() != src.dtype()) {
    MOE_ASSERT_MSG(src.dtype() == DType::F32 && is_half(dst.dtype()), "rows gathered from {} into {}",
                   dtype_name(src.dtype()), dtype_name(dst.dtype()));
    if (dst.dtype() == DType::F16) return gather_rounded_rows(src.data<float>(), tok, R, H, dst.data<f16>());
    return gather_rounded_rows(src.data<float>(), tok, R, H, dst.data<bf16>());
  }
  const size_t bytes = static_cast<size_t>(H) * dtype_size(src.dtype());
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++) {
    if (tok[r] < 0)
      std::memset(d + r * bytes, 0, bytes);  // a gap row of the padded layout
    else
      std::memcpy(d + r * bytes, s + tok[r] * bytes, bytes);
  }
}

void moe_scatter_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst) {
  const int64_t R = idx_R.numel(), H = src.cols();
  MOE_ASSERT(src.rows() == R && dst.cols() == H && dst.dtype() == src.dtype() && idx_R.dtype() == DType::I32);
  const size_t bytes = static_cast<size_t>(H) * dtype_size(src.dtype());
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
  const int32_t* idx = idx_R.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++)
    if (idx[r] >= 0) std::memcpy(d + idx[r] * bytes, s + r * bytes, bytes);
}

void moe_sum_rows_per_token(const Tensor& src_RH, const Tensor& token_offsets_T1, const Tensor& token_rows,
                            Tensor& dst_TH) {
  const int64_t T = dst_TH.rows(), H = src_RH.cols();
  MOE_ASSERT(token_offsets_T1.numel() == T + 1 && dst_TH.cols() == H);
  MOE_ASSERT(dst_TH.dtype() == moe_row_sum_dtype(src_RH.dtype()));
  const int64_t* off = token_offsets_T1.data<int64_t>();
  const int32_t* rows = token_rows.data<int32_t>();
  if (src_RH.dtype() == DType::BF16) return sum_token_rows(src_RH.data<bf16>(), off, rows, T, H, dst_TH.data<float>());
  if (src_RH.dtype() == DType::F16) return sum_token_rows(src_RH.data<f16>(), off, rows, T, H, dst_TH.data<float>());
  MOE_DISPATCH_FLOAT(src_RH.dtype(), F, { sum_token_rows(src_RH.data<F>(), off, rows, T, H, dst_TH.data<F>()); });
}

void moe_gather_probs(const Tensor& probs_TK, const Tensor& row_tk_R, Tensor& probs_R) {
  MOE_ASSERT(probs_R.numel() == row_tk_R.numel() && row_tk_R.dtype() == DType::I64);
  move_values<false>(probs_TK, row_tk_R.data<int64_t>(), row_tk_R.numel(), probs_R);
}

void moe_scatter_probs(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK) {
  MOE_ASSERT(dprobs_R.numel() == row_tk_R.numel() && row_tk_R.dtype() == DType::I64);
  dprobs_TK.zero_();
  move_values<true>(dprobs_R, row_tk_R.data<int64_t>(), row_tk_R.numel(), dprobs_TK);
}

// This backend's table (kernels/backends.h).
const MoePermuteKernels kMoePermuteKernels{moe_permute_plan,       moe_gather_rows,  moe_scatter_rows,
                                           moe_sum_rows_per_token, moe_gather_probs, moe_scatter_probs};

}  // namespace moecore::kernels::cpu
