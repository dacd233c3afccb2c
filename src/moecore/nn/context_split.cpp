// Context parallelism's sequence split (see context_split.h).
#include "moecore/nn/context_split.h"

#include <cstring>

#include "moecore/core/error.h"

namespace moecore::nn {

Tensor split_sequence_BS(const Tensor& x_BS, const SeqSplit& s) {
  if (!s.on() || !x_BS.defined()) return x_BS;
  MOE_ASSERT(x_BS.ndim() == 2);
  const int64_t B = x_BS.dim(0), S = x_BS.dim(1), L = S / s.size, sc = L / 2;
  MOE_CHECK(S % (2 * s.size) == 0,
            "sequence length {} does not split into 2 x --context-parallel-size {} = {} equal chunks", S, s.size,
            2 * s.size);
  Tensor y = Tensor::empty({B, L}, x_BS.dtype());
  const size_t esz = dtype_size(x_BS.dtype());
  const auto* src = static_cast<const char*>(x_BS.raw());
  auto* dst = static_cast<char*>(y.raw());
  for (int64_t b = 0; b < B; b++)
    for (int64_t half = 0; half < 2; half++)
      std::memcpy(dst + static_cast<size_t>(b * L + half * sc) * esz,
                  src + static_cast<size_t>(b * S + s.position(half * sc, L)) * esz, static_cast<size_t>(sc) * esz);
  return y;
}

Tensor rows_at_positions(const Tensor& table, int64_t L, const SeqSplit& s) {
  MOE_ASSERT(table.ndim() >= 1);
  MOE_CHECK(L * s.size <= table.dim(0), "sequence length {} exceeds the table's {} positions", L * s.size,
            table.dim(0));
  if (!s.on()) return table.slice(0, L);
  Shape shape = table.shape();
  shape.set(0, L);
  Tensor y = Tensor::empty(shape, table.dtype(), table.device());  // on the table's device (the GPU's RoPE tables)
  s.runs(0, L, L, [&](int64_t i, int64_t p, int64_t n) { y.slice(i, n).copy_from(table.slice(p, n)); });
  return y;
}

}  // namespace moecore::nn
