// Tensor-level MoE permutation on the GPU (see moe_kernels.h): checks, scratch from the caching allocator, then the
// launchers of launch_moe.h on the current stream.
#include <limits>

#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/runtime.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch_moe.h"
#include "moecore/kernels/cuda/moe_kernels.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using detail::check_launch;
using detail::f32;
using moecore::device::current_stream;

namespace {
// Device scratch of at least `bytes` bytes (CUB temp storage), stream-ordered like every other allocation.
Tensor moe_scratch(size_t bytes, Device d) {
  return Tensor::empty({static_cast<int64_t>((bytes + 7) / 8 + 1)}, DType::I64, d);
}

void moe_require_gpu(const Tensor& t, const char* name, DType dtype) {
  MOE_ASSERT_MSG(t.device().is_cuda(), "{} is on {}, but the MoE permutation runs on the GPU", name, t.device().str());
  MOE_ASSERT_MSG(t.dtype() == dtype, "{} is {}, expected {}", name, dtype_name(t.dtype()), dtype_name(dtype));
}

int64_t moe_row_elems(const Tensor& t) {  // elements per row (the dims after the first), also with 0 rows
  int64_t n = 1;
  for (int i = 1; i < t.ndim(); i++) n *= t.dim(i);
  return n;
}

int64_t moe_row_bytes(const Tensor& t) {
  return t.dim(0) == 0 ? 0 : t.nbytes() / t.dim(0);
}
}  // namespace

void moe_build_plan(const Tensor& idx_TK, int64_t E, std::vector<int64_t>& tokens_per_expert, Tensor& row_token_R,
                    Tensor& row_tk_R, Tensor& token_offsets_T1, Tensor& token_rows) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kPermute);
  moe_require_gpu(idx_TK, "idx_TK", DType::I32);
  const int64_t T = idx_TK.dim(0), K = idx_TK.dim(1), n = T * K;
  const Device d = idx_TK.device();
  MOE_ASSERT_MSG(n < std::numeric_limits<int32_t>::max(), "{} routed assignments exceed the GPU permutation's 2^31", n);
  MOE_ASSERT(E > 0 && E < std::numeric_limits<int32_t>::max());
  const cudaStream_t s = current_stream();
  const int64_t n1 = std::max<int64_t>(n, 1);
  Tensor keys_in = Tensor::empty({n1}, DType::I32, d), keys_out = Tensor::empty({n1}, DType::I32, d);
  Tensor vals_in = Tensor::empty({n1}, DType::I32, d), sorted_i = Tensor::empty({n1}, DType::I32, d);
  Tensor counts = Tensor::empty({E}, DType::I64, d);
  const size_t sort_bytes = launch::moe_sort_scratch_bytes(n, E);
  Tensor sort_tmp = moe_scratch(sort_bytes, d);
  launch::moe_sort_assignments(idx_TK.device_data<int32_t>(), n, E, reinterpret_cast<uint32_t*>(keys_in.raw()),
                               reinterpret_cast<uint32_t*>(keys_out.raw()), vals_in.device_data<int32_t>(),
                               sorted_i.device_data<int32_t>(), counts.device_data<int64_t>(), sort_tmp.raw(),
                               sort_bytes, s);
  check_launch("moe_sort_assignments");
  // The one host synchronisation of the GPU dispatch: the [E] row counts, which size every tensor below and the
  // grouped GEMM's per-expert problems (Megatron's tokens_per_expert is copied to the host the same way).
  tokens_per_expert.assign(static_cast<size_t>(E), 0);
  moecore::device::copy_bytes(tokens_per_expert.data(), Device::cpu(), counts.raw(), d,
                              static_cast<size_t>(E) * sizeof(int64_t));
  int64_t R = 0;
  for (int64_t c : tokens_per_expert) R += c;
  MOE_ASSERT(R <= n);
  row_token_R = Tensor::empty({R}, DType::I32, d);
  row_tk_R = Tensor::empty({R}, DType::I64, d);
  Tensor row_of_i = Tensor::empty({n1}, DType::I32, d);
  launch::moe_build_rows(sorted_i.device_data<int32_t>(), n, R, K, row_token_R.device_data<int32_t>(),
                         row_tk_R.device_data<int64_t>(), row_of_i.device_data<int32_t>(), s);
  check_launch("moe_build_rows");
  token_offsets_T1 = Tensor::empty({T + 1}, DType::I64, d);
  token_rows = Tensor::empty({R}, DType::I32, d);
  Tensor counts_T = Tensor::empty({std::max<int64_t>(T, 1)}, DType::I64, d);
  const size_t csr_bytes = launch::moe_csr_scratch_bytes(T);
  Tensor csr_tmp = moe_scratch(csr_bytes, d);
  launch::moe_token_csr(row_of_i.device_data<int32_t>(), T, K, counts_T.device_data<int64_t>(),
                        token_offsets_T1.device_data<int64_t>(), token_rows.device_data<int32_t>(), csr_tmp.raw(),
                        csr_bytes, s);
  check_launch("moe_token_csr");
}

void moe_permute_plan(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t, int64_t row_align,
                      PermutePlan& plan) {
  MOE_ASSERT_MSG(row_align == 1, "the GPU experts take rows back to back, asked for a {}-row alignment", row_align);
  MOE_ASSERT_MSG(pad_capacity == 0, "the GPU's plan pads to no capacity, asked for {}", pad_capacity);
  moe_build_plan(idx_TK, E, plan.tokens_per_expert, plan.row_token_R, plan.row_tk_R, plan.token_offsets_T1,
                 plan.token_rows);
  plan.R = plan.row_token_R.numel();
}

void moe_gather_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kPermute);
  moe_require_gpu(idx_R, "row index", DType::I32);
  const int64_t R = idx_R.numel();
  MOE_ASSERT_MSG(dst.dim(0) == R && moe_row_elems(src) == moe_row_elems(dst), "row gather of {} into {} by {} indices",
                 src.shape().str(), dst.shape().str(), R);
  MOE_ASSERT(src.device() == idx_R.device() && dst.device() == idx_R.device());
  if (src.dtype() == dst.dtype()) {
    launch::moe_gather_rows(src.raw(), idx_R.device_data<int32_t>(), dst.raw(), R, moe_row_bytes(dst),
                            current_stream());
  } else {
    MOE_ASSERT_MSG(src.dtype() == DType::F32 && dst.dtype() == DType::BF16,
                   "row gather converts f32 to bf16 only, got {} to {}", dtype_name(src.dtype()),
                   dtype_name(dst.dtype()));
    launch::moe_gather_rows_f32_to_bf16(src.device_data<float>(), idx_R.device_data<int32_t>(), dst.raw(), R,
                                        moe_row_elems(dst), current_stream());
  }
  check_launch("moe_gather_rows");
}

void moe_scatter_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kPermute);
  moe_require_gpu(idx_R, "row index", DType::I32);
  const int64_t R = idx_R.numel();
  MOE_ASSERT(src.dim(0) == R && src.dtype() == dst.dtype() && src.device() == dst.device());
  MOE_ASSERT(moe_row_elems(src) == moe_row_elems(dst));
  launch::moe_scatter_rows(src.raw(), idx_R.device_data<int32_t>(), dst.raw(), R, moe_row_bytes(src), current_stream());
  check_launch("moe_scatter_rows");
}

void moe_sum_rows_per_token(const Tensor& src_RH, const Tensor& token_offsets_T1, const Tensor& token_rows,
                            Tensor& dst_TH) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kPermute);
  moe_require_gpu(token_offsets_T1, "token_offsets", DType::I64);
  moe_require_gpu(token_rows, "token_rows", DType::I32);
  const int64_t T = dst_TH.rows(), H = dst_TH.cols();
  MOE_ASSERT(token_offsets_T1.numel() == T + 1 && src_RH.cols() == H && token_rows.numel() == src_RH.rows());
  MOE_ASSERT_MSG(src_RH.device().is_cuda() && (src_RH.dtype() == DType::F32 || src_RH.dtype() == DType::BF16),
                 "the row sum reads f32 or bf16 rows on the GPU, got {} on {}", dtype_name(src_RH.dtype()),
                 src_RH.device().str());
  launch::moe_sum_rows_per_token(src_RH.raw(), src_RH.dtype() == DType::BF16, token_offsets_T1.device_data<int64_t>(),
                                 token_rows.device_data<int32_t>(), f32(dst_TH, "dst_TH"), T, H, current_stream());
  check_launch("moe_sum_rows_per_token");
}

void moe_gather_probs(const Tensor& probs_TK, const Tensor& row_tk_R, Tensor& probs_R) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kPermute);
  moe_require_gpu(row_tk_R, "row_tk", DType::I64);
  MOE_ASSERT(probs_R.numel() == row_tk_R.numel());
  launch::moe_gather_probs(f32(probs_TK, "probs_TK"), row_tk_R.device_data<int64_t>(), f32(probs_R, "probs_R"),
                           row_tk_R.numel(), current_stream());
  check_launch("moe_gather_probs");
}

void moe_scatter_probs(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kPermute);
  moe_require_gpu(row_tk_R, "row_tk", DType::I64);
  MOE_ASSERT(dprobs_R.numel() == row_tk_R.numel());
  dprobs_TK.zero_();
  launch::moe_scatter_probs(f32(dprobs_R, "dprobs_R"), row_tk_R.device_data<int64_t>(), f32(dprobs_TK, "dprobs_TK"),
                            row_tk_R.numel(), current_stream());
  check_launch("moe_scatter_probs");
}

// This backend's table (kernels/backends.h).
const MoePermuteKernels kMoePermuteKernels{moe_permute_plan,       moe_gather_rows,  moe_scatter_rows,
                                           moe_sum_rows_per_token, moe_gather_probs, moe_scatter_probs};

}  // namespace moecore::kernels::cuda
