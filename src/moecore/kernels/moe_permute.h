// The MoE token permutation's ops (moe/token_dispatcher.cpp runs them, once for both devices): the dispatch plan
// built from the router's [T, K] ids, row gathers and scatters, the per-token ordered row sum, and the probability
// moves. Not here: the exchanges between ranks and the chunk reordering of expert parallelism (moe/). Each op runs
// where its tensors live: on the CPU (kernels/cpu/moe_permute.cpp: any float dtype; it writes rows straight into the
// experts' padded layout and rounds f32 rows to bf16 as it copies) or on a GPU (kernels/cuda/moe_permute_ops.cpp
// over moe_permute.cu, with CUB; f32 probabilities).
#pragma once

#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// Where each routed row goes: rows expert-major, ascending token inside an expert (Megatron's permute); each
// token's rows in ascending expert order for the combine's fixed-order sum. On idx_TK's device (the counts on the
// host: they size every tensor after them and the grouped GEMM's problems).
struct PermutePlan {
  int64_t R = 0;                           // rows, the padded layout's gap rows included
  std::vector<int64_t> tokens_per_expert;  // [E] rows per expert, gap rows not counted
  Tensor row_token_R;                      // I32: source token of each row, −1 for a gap row
  Tensor row_tk_R;                         // I64: t·K + j of each row (its [T, K] entry), −1 for a padding row
  Tensor token_offsets_T1;                 // I64 CSR over tokens: rows of token t are
  Tensor token_rows;                       //   token_rows[token_offsets[t] .. token_offsets[t+1]) (I32)
  std::vector<int64_t> expert_offsets;     // CPU scratch [E + 1]: row offsets per expert while permuting
  Tensor token_cursor_T;                   // CPU scratch I64 [T]: fill position per token while permuting
};

// The plan of idx_TK (I32 [T, K]) over experts [0, E) (other ids, −1 included, have no row). Every expert's rows start
// at a multiple of row_align; the gap rows after them have no token and no entry (the CPU grouped experts' padded
// layout; 1 on a GPU). Under padding (pad_capacity > 0), every block of `block` tokens (one source rank's) gives each
// expert exactly pad_capacity rows: its own, then the earliest tokens of the block without one, at no entry
// (row_tk −1). A GPU builds the padded plan on host copies of the ids and moves it to the GPU.
void moe_permute_plan(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t block, int64_t row_align,
                      PermutePlan& plan);

// dst[r] = src[idx_R[r]] (idx_R I32; a negative index gives a zero row). dst's dtype is src's, or bf16 from f32
// (rounded to nearest even as the row is copied).
void moe_gather_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst);
// dst[idx_R[r]] = src[r] (same dtype; no two rows share a target; a negative index is skipped).
void moe_scatter_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst);
// dst_TH[t] = Σ src_RH[token_rows[i]], i over token t's CSR range in order, from 0; bf16 rows summed in f32
// (moe_row_sum_dtype).
void moe_sum_rows_per_token(const Tensor& src_RH, const Tensor& token_offsets_T1, const Tensor& token_rows,
                            Tensor& dst_TH);
DType moe_row_sum_dtype(DType rows);
// probs_R[r] = probs_TK[row_tk_R[r]], 0 where row_tk_R[r] < 0 (converted to probs_R's dtype).
void moe_gather_probs(const Tensor& probs_TK, const Tensor& row_tk_R, Tensor& probs_R);
// dprobs_TK = 0, then dprobs_TK[row_tk_R[r]] = dprobs_R[r] where row_tk_R[r] >= 0 (converted to dprobs_TK's dtype).
void moe_scatter_probs(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK);

// n rounded up to a multiple of align.
int64_t align_up(int64_t n, int64_t align);
// [padded, C] rows of `rows` rows over `experts` experts in the padded layout (row_align), allocated at the largest
// size they can take, so the allocator sees one size every step however the rows fall.
Tensor padded_rows_empty(int64_t rows, int64_t experts, int64_t align, int64_t padded, int64_t C, DType dtype,
                         Device device = Device::cpu());

// The entry points above as one backend implements them (kernels/cpu/moe_permute.cpp,
// kernels/cuda/moe_permute_ops.cpp), each with the signature of the op it is named after; kernels/moe_permute.cpp
// calls the table kernels/dispatch.cpp picks for the tensors' device. The GPU's plan takes no padding to capacity
// (moe_permute.cpp builds that one on the host) and no row alignment.
struct MoePermuteKernels {
  void (*plan)(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t block, int64_t row_align,
               PermutePlan& plan);
  void (*gather_rows)(const Tensor& src, const Tensor& idx_R, Tensor& dst);
  void (*scatter_rows)(const Tensor& src, const Tensor& idx_R, Tensor& dst);
  void (*sum_rows_per_token)(const Tensor& src_RH, const Tensor& token_offsets_T1, const Tensor& token_rows,
                             Tensor& dst_TH);
  void (*gather_probs)(const Tensor& probs_TK, const Tensor& row_tk_R, Tensor& probs_R);
  void (*scatter_probs)(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK);
};

}  // namespace moecore::kernels

// The table's ops as each backend declares them (kernels/cpu/moe_permute.h, kernels/cuda/moe_kernels.h expand it in
// their namespace), once.
#define MOECORE_MOE_PERMUTE_OPS                                                                                  \
  void moe_permute_plan(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t block, int64_t row_align, \
                        PermutePlan& plan);                                                                      \
  void moe_gather_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst);                                     \
  void moe_scatter_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst);                                    \
  void moe_sum_rows_per_token(const Tensor& src_RH, const Tensor& token_offsets_T1, const Tensor& token_rows,    \
                              Tensor& dst_TH);                                                                   \
  void moe_gather_probs(const Tensor& probs_TK, const Tensor& row_tk_R, Tensor& probs_R);                        \
  void moe_scatter_probs(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK);
