#pragma once
// Non-owning views of contiguous, row-major tensors.
//
// TensorView<T> is a pointer and a shape, trivially copyable. ParamView and
// GradView erase the element type (fp32, bf16, fp16) so that one optimizer can
// hold parameters of several dtypes; the backend dispatches on the dtype once
// per tensor per step, never per element.

#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "../detail/config.hpp"
#include "dtype.hpp"
#include "shape.hpp"

namespace skewadam {

template <class T>
class TensorView {
  static_assert(is_element_type_v<std::remove_const_t<T>>,
                "skewadam::TensorView: element type must be float, skewadam::bf16 or skewadam::f16 "
                "(optionally const)");

 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  constexpr TensorView() = default;
  TensorView(T* data, Shape shape, std::string_view argument = "view") : data_(data), shape_(shape) {
    if (shape_.rank() == 0) throw std::invalid_argument(std::string(argument) + ": shape has rank 0");
    if (data_ == nullptr && shape_.numel() > 0)
      throw std::invalid_argument(std::string(argument) + ": null data pointer for " + shape_.str() +
                                  " elements");
  }
  TensorView(T* data, std::initializer_list<index_t> dims, std::string_view argument = "view")
      : TensorView(data, Shape(dims, argument), argument) {}

  /// A view of mutable data converts to a view of const data.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  constexpr TensorView(const TensorView<U>& other) noexcept : data_(other.data()), shape_(other.shape()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr const Shape& shape() const noexcept { return shape_; }
  constexpr index_t numel() const noexcept { return shape_.numel(); }
  constexpr bool empty() const noexcept { return numel() == 0; }
  constexpr T& operator[](index_t i) const noexcept { return data_[i]; }

 private:
  T* data_ = nullptr;
  Shape shape_{};
};

template <class T>
TensorView(T*, Shape) -> TensorView<T>;

/// A parameter: mutable, any supported dtype.
struct ParamView {
  void* data = nullptr;
  Dtype dtype = Dtype::f32;
  Shape shape{};

  ParamView() = default;
  template <class T, class = std::enable_if_t<!std::is_const_v<T>>>
  ParamView(TensorView<T> v) noexcept : data(v.data()), dtype(dtype_of<T>()), shape(v.shape()) {}

  index_t numel() const noexcept { return shape.numel(); }
  index_t bytes() const noexcept { return numel() * dtype_size(dtype); }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(data); }
};

/// A gradient: read-only, fp32 or the parameter's dtype. A default-constructed
/// GradView means "no gradient this step".
struct GradView {
  const void* data = nullptr;
  Dtype dtype = Dtype::f32;
  Shape shape{};

  GradView() = default;
  template <class T>
  GradView(TensorView<T> v) noexcept : data(v.data()), dtype(dtype_of<T>()), shape(v.shape()) {}

  bool present() const noexcept { return shape.rank() > 0; }
  index_t numel() const noexcept { return shape.numel(); }
  template <class T>
  const T* as() const noexcept { return static_cast<const T*>(data); }
};

}  // namespace skewadam
