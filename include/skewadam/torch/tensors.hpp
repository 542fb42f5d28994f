#pragma once
// The LibTorch adapter's tensors: a parameter's dtype, shape and views for the
// library (ParamView, GradView), its state as torch tensors viewing the
// optimizer's own arrays (ParamState, in their logical shapes), and the key
// of its entry in torch's state map.

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <sstream>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../state/state_layout.hpp"
#include "../types/dtype.hpp"
#include "../types/shape.hpp"
#include "../types/tensor_view.hpp"
#include "../types/tier.hpp"

namespace skewadam::libtorch {

static_assert(sizeof(c10::BFloat16) == sizeof(bf16) && sizeof(c10::Half) == sizeof(f16),
              "skewadam::libtorch: LibTorch's 16-bit types must have the layout of skewadam's");

/// One parameter's state as seen through torch: tensors that view the
/// optimizer's own fp32 state (undefined when the rule keeps none).
///   m      first moment, the parameter's shape
///   v      exact second moment, the parameter's shape
///   v_row  factored second moment, [..., r]
///   v_col  factored second moment, [..., c]
/// Writing to them changes the optimizer's state; never resize them.
class ParamState : public ::torch::optim::OptimizerCloneableParamState<ParamState> {
 public:
  std::string name;
  Tier tier = Tier::backbone;
  std::int64_t step = 0;  ///< updates received so far
  at::Tensor m, v, v_row, v_col;

  /// Bytes of state (docs/spec.md §2; the step counter is not counted).
  std::int64_t bytes() const {
    std::int64_t b = 0;
    for (const at::Tensor* t : {&m, &v, &v_row, &v_col})
      if (t->defined()) b += t->numel() * 4;
    return b;
  }

  void serialize(::torch::serialize::OutputArchive& archive) const override {
    archive.write("step", c10::IValue(step));
    if (m.defined()) archive.write("m", m, true);
    if (v.defined()) archive.write("v", v, true);
    if (v_row.defined()) archive.write("v_row", v_row, true);
    if (v_col.defined()) archive.write("v_col", v_col, true);
  }
  void serialize(::torch::serialize::InputArchive&) override {
    throw std::logic_error("skewadam::libtorch::ParamState: read the state with Optimizer::load()");
  }
};

namespace detail {

/// The state map's key: a string in LibTorch 1.x (and 2.0/2.1), the
/// TensorImpl's address from 2.2 on. Deduced from the map rather than from
/// TORCH_VERSION, so every release compiles.
using TorchStateMap =
    std::remove_cv_t<std::remove_reference_t<decltype(std::declval<::torch::optim::Optimizer&>().state())>>;
using TorchStateKey = typename TorchStateMap::key_type;

template <class Key>
Key state_key_of(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;  // the format torch's own optimizers use for these keys
    s << static_cast<const void*>(p.unsafeGetTensorImpl());
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace detail

/// The key of a parameter's entry in a torch::optim::Optimizer's state():
/// a string in LibTorch 1.x (and 2.0/2.1), the TensorImpl's address from 2.2
/// on, as torch's own optimizers form it.
inline detail::TorchStateKey state_key(const at::Tensor& p) { return detail::state_key_of<detail::TorchStateKey>(p); }

namespace detail {

inline Dtype dtype_of_tensor(const at::Tensor& t, const std::string& who) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dtype::f32;
    case at::kBFloat16: return Dtype::bf16;
    case at::kHalf: return Dtype::f16;
    default:
      throw std::invalid_argument(who + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                                  " is not supported (float32, bfloat16 or float16)");
  }
}

inline Shape shape_of_tensor(const at::Tensor& t, const std::string& who) {
  const auto sizes = t.sizes();
  if (sizes.empty()) return Shape({1}, who);  // a scalar is a one-element vector
  if (static_cast<int>(sizes.size()) > max_rank)
    throw std::invalid_argument(who + ": rank " + std::to_string(sizes.size()) + " is above the supported " +
                                std::to_string(max_rank));
  return Shape(sizes.begin(), static_cast<index_t>(sizes.size()), who);
}

inline ParamView param_view(const at::Tensor& t, Dtype d, const Shape& s) {
  ParamView v;
  v.data = t.data_ptr();
  v.dtype = d;
  v.shape = s;
  return v;
}

inline GradView grad_view(const at::Tensor& g, Dtype d, const Shape& s) {
  GradView v;
  v.data = g.data_ptr();
  v.dtype = d;
  v.shape = s;
  return v;
}

/// A float tensor viewing `span` (no copy) on `device`, or an undefined tensor.
inline at::Tensor view_of(std::span<const float> span, std::vector<std::int64_t> sizes, at::Device device) {
  if (span.empty()) return {};
  return at::from_blob(const_cast<float*>(span.data()), sizes, at::TensorOptions().dtype(at::kFloat).device(device));
}

/// Logical shapes of the state arrays of a parameter of `shape`.
struct StateShapes {
  std::vector<std::int64_t> m, full, rows, cols;
};
/// The logical shapes of a parameter's state arrays under its rule's
/// layout: those of the checkpoint format (a momentum stored in fewer bits
/// is its words, flat: state_layout.hpp).
inline StateShapes state_shapes(const Shape& shape, StateLayout layout) {
  StateShapes s;
  s.full.assign(shape.begin(), shape.end());
  s.m = s.full;
  if (layout.momentum && layout.storage != MomentumStorage::f32)
    s.m = {static_cast<std::int64_t>(momentum_words(layout, shape.matrices()))};
  const MatrixGeometry g = shape.matrices();
  if (shape.rank() >= 2) {
    s.rows.assign(shape.begin(), shape.end() - 1);                    // [..., r]
    s.cols.assign(shape.begin(), shape.end() - 2);                    // [..., c]
    s.cols.push_back(g.cols);
  } else {
    s.rows = {g.rows};
    s.cols = {g.cols};
  }
  return s;
}

}  // namespace detail

}  // namespace skewadam::libtorch
