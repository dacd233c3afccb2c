// Tensor: a typed, contiguous, row-major view into reference-counted storage from the caching allocator.
// Views (leading-dim slices, reshapes) share storage and cost nothing. No strides, no autograd, no broadcasting:
// kernels take tensors of the exact shapes they assert. A tensor lives on a Device (core/device.h): the CPU by
// default, or a GPU, whose storage comes from the GPU's stream-ordered caching allocator (cuda/runtime.h); host
// code reads a GPU tensor only through to(Device::cpu()) (data<T>() on it is an error naming the fix).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "moecore/core/device.h"
#include "moecore/core/dtype.h"
#include "moecore/core/error.h"

namespace moecore {

class Shape {
 public:
  static constexpr int kMaxDims = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int ndim() const { return nd_; }
  int64_t operator[](int i) const;
  int64_t numel() const;
  int64_t back() const { return (*this)[nd_ - 1]; }
  bool operator==(const Shape& o) const;
  std::string str() const;
  void push_back(int64_t d);
  void set(int i, int64_t d);

 private:
  std::array<int64_t, kMaxDims> d_{};
  int nd_ = 0;
};

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  explicit Storage(size_t n, Device d = Device::cpu());
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // A shape and dtype with no storage (defined() is false; its elements must not be read): a parameter's value or
  // gradient this rank does not hold now (Megatron FSDP's freed units, meta-device initialisation).
  static Tensor unallocated(const Shape& shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.ndim() + i : i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // Rows when seen as a 2-D matrix [numel / last dim, last dim].
  int64_t rows() const {
    int64_t r = 1;
    for (int i = 0; i + 1 < shape_.ndim(); i++) r *= shape_[i];
    return r;
  }
  int64_t cols() const { return shape_.ndim() == 0 ? 1 : shape_.back(); }

  void* raw() const { return static_cast<char*>(storage_->ptr) + offset_; }
  template <typename T>
  T* data() const {
    MOE_ASSERT_MSG(dtype_of<T>() == dtype_ && device_.is_cpu(), "{}", data_error(dtype_name(dtype_of<T>())));
    return static_cast<T*>(raw());
  }
  // The typed address on whatever device the tensor lives on: for kernel launchers, never dereferenced on the host.
  template <typename T>
  T* device_data() const {
    MOE_ASSERT_MSG(dtype_of<T>() == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
                   dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  // Rows [start, start+len) of the leading dimension, sharing storage.
  Tensor slice(int64_t start, int64_t len) const;
  // Same elements, new shape (numel must match), sharing storage.
  Tensor reshape(const Shape& shape) const;
  // Shares storage: true when both views point into the same allocation.
  bool shares_storage(const Tensor& o) const { return storage_ == o.storage_; }

  void zero_();
  // Copies (with dtype conversion between floating types) from a tensor of the same numel.
  void copy_from(const Tensor& src);
  Tensor clone() const;
  // A new tensor of another floating dtype with the same values (rounded when narrowing).
  Tensor to(DType dtype) const;
  // This tensor when it already has `dtype` (shared, no copy), else to(dtype): for an operand its producer may have
  // written in the dtype its consumer wants.
  Tensor as_dtype(DType dtype) const { return dtype_ == dtype ? *this : to(dtype); }
  // A copy on another device (the same tensor when it is already there).
  Tensor to(Device device) const;
  // Element i as double, for tests and diagnostics (slow).
  double item(int64_t i) const;
  void set_item(int64_t i, double v);

 private:
  std::shared_ptr<Storage> storage_;
  std::string data_error(std::string_view as) const;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_;
};

// Runs `body` with `T` bound to the C++ type of a floating dtype computed in (f32 or f64).
#define MOE_DISPATCH_FLOAT(dtype, T, ...)                                                             \
  do {                                                                                                \
    switch (dtype) {                                                                                  \
      case ::moecore::DType::F32: {                                                                   \
        using T = float;                                                                              \
        __VA_ARGS__;                                                                                  \
        break;                                                                                        \
      }                                                                                               \
      case ::moecore::DType::F64: {                                                                   \
        using T = double;                                                                             \
        __VA_ARGS__;                                                                                  \
        break;                                                                                        \
      }                                                                                               \
      default:                                                                                        \
        MOE_ASSERT_MSG(false, "kernel computes in f32 or f64, got {}", ::moecore::dtype_name(dtype)); \
    }                                                                                                 \
  } while (0)

// Asserts a tensor's shape at a kernel entry, naming the tensor.
#define MOE_ASSERT_SHAPE(t, ...)                                                                                      \
  MOE_ASSERT_MSG((t).shape() == ::moecore::Shape(__VA_ARGS__), "{} has shape {}, expected {}", #t, (t).shape().str(), \
                 ::moecore::Shape(__VA_ARGS__).str())

}  // namespace moecore
