#pragma once
// Views of Eigen matrices and vectors.
//
// Factored statistics follow the tensor's row-major layout (rows = the
// second-to-last dimension), so matrices must be row-major: an Eigen
// column-major r x c matrix stores a different tensor in memory. Column
// vectors and row vectors become rank-1 tensors. Views must be contiguous
// (no inner or outer stride); Eigen::Map and Eigen::Ref both work:
//
//   Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> w(64, 32), g(64, 32);
//   opt.add("w", skewadam::Tier::backbone, skewadam::eigen_view(w), skewadam::eigen_view(std::as_const(g)));

#include <Eigen/Core>

#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "types/tensor_view.hpp"

namespace skewadam {

namespace detail {

/// T is the view's element type (const when the data must not be written).
template <class T, class Object>
TensorView<T> eigen_view_impl(const Object& m, std::string_view argument) {
  constexpr bool is_vector = Object::IsVectorAtCompileTime;
  static_assert(is_vector || bool(Object::IsRowMajor),
                "skewadam::eigen_view: matrices must be row-major (Eigen::RowMajor); a column-major matrix "
                "stores the transposed tensor and would be factored over the wrong dimensions");
  static_assert(is_element_type_v<std::remove_const_t<T>>,
                "skewadam::eigen_view: scalar must be float, skewadam::bf16 or skewadam::f16");
  const index_t rows = m.rows();
  const index_t cols = m.cols();
  if constexpr (!is_vector) {
    if (m.innerStride() != 1 || (rows > 1 && m.outerStride() != cols))
      throw std::invalid_argument(std::string(argument) + ": Eigen object is not contiguous (stride)");
  } else {
    if (m.innerStride() != 1 && rows * cols > 1)
      throw std::invalid_argument(std::string(argument) + ": Eigen vector is not contiguous (stride)");
  }
  T* data = const_cast<T*>(m.data());
  if constexpr (is_vector) return TensorView<T>(data, Shape({rows * cols}, argument), argument);
  else return TensorView<T>(data, Shape({rows, cols}, argument), argument);
}

}  // namespace detail

/// A view of an Eigen Matrix (mutable).
template <class Derived>
auto eigen_view(Eigen::PlainObjectBase<Derived>& m, std::string_view argument = "eigen view") {
  return detail::eigen_view_impl<typename Derived::Scalar>(m.derived(), argument);
}

/// A view of a const Eigen Matrix (read-only: for gradients).
template <class Derived>
auto eigen_view(const Eigen::PlainObjectBase<Derived>& m, std::string_view argument = "eigen view") {
  return detail::eigen_view_impl<const typename Derived::Scalar>(m.derived(), argument);
}

/// A view of an Eigen::Map; read-only when the mapped type is const.
template <class PlainType, int MapOptions, class StrideType>
auto eigen_view(const Eigen::Map<PlainType, MapOptions, StrideType>& m, std::string_view argument = "eigen view") {
  using S = typename std::remove_const_t<PlainType>::Scalar;
  using T = std::conditional_t<std::is_const_v<PlainType>, const S, S>;
  return detail::eigen_view_impl<T>(m, argument);
}

/// A view of an Eigen::Ref; read-only when the referenced type is const.
template <class PlainType, int RefOptions, class StrideType>
auto eigen_view(const Eigen::Ref<PlainType, RefOptions, StrideType>& m, std::string_view argument = "eigen view") {
  using S = typename std::remove_const_t<PlainType>::Scalar;
  using T = std::conditional_t<std::is_const_v<PlainType>, const S, S>;
  return detail::eigen_view_impl<T>(m, argument);
}

}  // namespace skewadam
