// Tensor, Shape and Storage (see tensor.h).
#include "moecore/core/tensor.h"

#include <cstring>

#include "moecore/core/allocator.h"
#include "moecore/core/device_memory.h"

namespace moecore {

Shape::Shape(std::initializer_list<int64_t> dims) {
  MOE_ASSERT(static_cast<int>(dims.size()) <= kMaxDims);
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  MOE_ASSERT(nd_ < kMaxDims);
  MOE_ASSERT_MSG(d >= 0, "negative dimension {}", d);
  d_[nd_++] = d;
}

void Shape::set(int i, int64_t d) {
  MOE_ASSERT(i >= 0 && i < nd_ && d >= 0);
  d_[i] = d;
}

int64_t Shape::operator[](int i) const {
  MOE_ASSERT_MSG(i >= 0 && i < nd_, "dimension {} of a {}-d shape", i, nd_);
  return d_[i];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < nd_; i++)
    MOE_CHECK(!__builtin_mul_overflow(n, d_[i], &n), "a tensor of shape {} has more elements than fit in 64 bits",
              str());
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (nd_ != o.nd_) return false;
  for (int i = 0; i < nd_; i++)
    if (d_[i] != o.d_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < nd_; i++) s += (i ? ", " : "") + std::to_string(d_[i]);
  return s + "]";
}

Storage::Storage(size_t n, Device d) : bytes(n), device(d) {
  ptr = d.is_cpu() ? Allocator::instance().allocate(n) : device::device_allocate(n, d);
}
Storage::~Storage() {
  if (device.is_cpu())
    Allocator::instance().deallocate(ptr, bytes);
  else
    device::device_deallocate(ptr, device);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::unallocated(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

std::string Tensor::data_error(std::string_view as) const {
  if (!device_.is_cpu())
    return fmt::format(
        "a {} tensor {} on {} was read from host code; copy it first with .to(Device::cpu()) (or "
        "launch a CUDA kernel on it)",
        dtype_name(dtype_), shape_.str(), device_.str());
  return fmt::format("tensor is {}, accessed as {}", dtype_name(dtype_), as);
}

Tensor Tensor::slice(int64_t start, int64_t len) const {
  MOE_ASSERT(ndim() >= 1);
  MOE_ASSERT_MSG(start >= 0 && len >= 0 && start + len <= shape_[0], "slice [{}, {}) of leading dim {}", start,
                 start + len, shape_[0]);
  Tensor t = *this;
  int64_t row = numel() / (shape_[0] == 0 ? 1 : shape_[0]);
  t.offset_ += static_cast<size_t>(start * row) * dtype_size(dtype_);
  t.shape_.set(0, len);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  MOE_ASSERT_MSG(shape.numel() == numel(), "reshape {} -> {} changes the element count", shape_.str(), shape.str());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

namespace {
// A large byte range in 256 KiB pieces over the threads: one core does not reach the memory's bandwidth, and the
// other would wait at the next parallel region (the experts' padding copies, clones of activations, zeroed
// gradients). f(offset, length) handles one piece.
template <typename F>
void in_pieces(size_t bytes, const F& f) {
  constexpr size_t kPiece = size_t{1} << 18;
  if (bytes < 4 * kPiece) {
    f(size_t{0}, bytes);
    return;
  }
  const int64_t pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pieces; i++) {
    const size_t off = static_cast<size_t>(i) * kPiece;
    f(off, std::min(kPiece, bytes - off));
  }
}

}  // namespace

void Tensor::zero_() {
  if (numel() == 0) return;
  if (device_.is_cuda())
    device::zero_bytes(raw(), nbytes(), device_);
  else
    in_pieces(nbytes(), [p = static_cast<char*>(raw())](size_t off, size_t n) { std::memset(p + off, 0, n); });
}

double Tensor::item(int64_t i) const {
  MOE_ASSERT(i >= 0 && i < numel());
  if (device_.is_cuda()) return reshape({numel()}).slice(i, 1).to(Device::cpu()).item(0);
  switch (dtype_) {
    case DType::F32:
      return data<float>()[i];
    case DType::F64:
      return data<double>()[i];
    case DType::BF16:
      return bf16_to_float(data<bf16>()[i]);
    case DType::F16:
      return f16_to_float(data<f16>()[i]);
    case DType::I32:
      return data<int32_t>()[i];
    case DType::I64:
      return static_cast<double>(data<int64_t>()[i]);
  }
  return 0;
}

void Tensor::set_item(int64_t i, double v) {
  MOE_ASSERT(i >= 0 && i < numel());
  if (device_.is_cuda()) {
    Tensor one = Tensor::empty({1}, dtype_);
    one.set_item(0, v);
    reshape({numel()}).slice(i, 1).copy_from(one);
    return;
  }
  switch (dtype_) {
    case DType::F32:
      data<float>()[i] = static_cast<float>(v);
      break;
    case DType::F64:
      data<double>()[i] = v;
      break;
    case DType::BF16:
      data<bf16>()[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DType::F16:
      data<f16>()[i] = float_to_f16(static_cast<float>(v));
      break;
    case DType::I32:
      data<int32_t>()[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      data<int64_t>()[i] = static_cast<int64_t>(v);
      break;
  }
}

namespace {
// bf16 is read and written through its uint16_t bits: struct loads and stores keep loops from vectorizing.
template <typename D, typename S>
void convert(D* dst, const S* src, int64_t n) {
  if constexpr (std::is_same_v<D, f16> || std::is_same_v<S, f16>) {  // f16 through f32 (exact both ways from bf16)
    auto widen = [](S v) {
      if constexpr (std::is_same_v<S, f16>)
        return f16_to_float(v);
      else if constexpr (std::is_same_v<S, bf16>)
        return bf16_to_float(v);
      else
        return static_cast<float>(v);
    };
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
      const float f = widen(src[i]);
      if constexpr (std::is_same_v<D, f16>)
        dst[i] = float_to_f16(f);
      else if constexpr (std::is_same_v<D, bf16>)
        dst[i] = float_to_bf16(f);
      else
        dst[i] = static_cast<D>(f);
    }
  } else if constexpr (std::is_same_v<D, bf16> && !std::is_same_v<S, bf16>) {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) d[i] = float_to_bf16(static_cast<float>(src[i])).bits;
  } else if constexpr (std::is_same_v<S, bf16> && !std::is_same_v<D, bf16>) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
      const uint32_t u = static_cast<uint32_t>(s[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      dst[i] = static_cast<D>(f);
    }
  } else {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) dst[i] = static_cast<D>(src[i]);
  }
}

void copy_bytes_parallel(void* dst, const void* src, size_t bytes) {
  in_pieces(bytes, [&](size_t off, size_t n) {
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, n);
  });
}

template <typename D>
void convert_from(D* dst, const Tensor& src) {
  int64_t n = src.numel();
  switch (src.dtype()) {
    case DType::F32:
      convert(dst, src.data<float>(), n);
      break;
    case DType::F64:
      convert(dst, src.data<double>(), n);
      break;
    case DType::BF16:
      convert(dst, src.data<bf16>(), n);
      break;
    case DType::F16:
      convert(dst, src.data<f16>(), n);
      break;
    default:
      MOE_ASSERT_MSG(false, "cannot convert from {}", dtype_name(src.dtype()));
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  MOE_ASSERT_MSG(src.numel() == numel(), "copy of {} elements into {}", src.numel(), numel());
  if (!device_.is_cpu() || !src.device_.is_cpu()) {
    if (numel() == 0) return;
    if (src.dtype() == dtype_) {
      if (raw() != src.raw()) device::copy_bytes(raw(), device_, src.raw(), src.device_, nbytes());
    } else if (device_.is_cuda() && src.device_ == device_) {
      device::convert_on_device(raw(), dtype_, src.raw(), src.dtype(), numel());
    } else if (device_.is_cuda()) {  // host → GPU with conversion: convert on the host, then one copy
      copy_from(src.to(dtype_));
    } else {  // GPU → host with conversion
      copy_from(src.to(Device::cpu()));
    }
    return;
  }
  if (src.dtype() == dtype_) {
    if (numel() > 0 && raw() != src.raw()) copy_bytes_parallel(raw(), src.raw(), nbytes());
    return;
  }
  switch (dtype_) {
    case DType::F32:
      convert_from(data<float>(), src);
      break;
    case DType::F64:
      convert_from(data<double>(), src);
      break;
    case DType::BF16:
      convert_from(data<bf16>(), src);
      break;
    case DType::F16:
      convert_from(data<f16>(), src);
      break;
    default:
      MOE_ASSERT_MSG(false, "cannot convert {} to {}", dtype_name(src.dtype()), dtype_name(dtype_));
  }
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

}  // namespace moecore
