// skewadam-checkpoint-interop DIR VARIANT FIRST LAST [--load FILE] [--save FILE]
//
// The C++ half of the checkpoint test between languages
// (python/tests/test_checkpoint.py): trains the small model below with the
// core library, as a C++ program would, on the values and gradients the test
// wrote, and saves or loads the library's checkpoint file. The Python half
// trains the same model through the Python package; the files each writes
// must be identical, and each must resume the other's run bit for bit.
//
// DIR holds, for the i-th parameter of `model`, p<i>.npy (its initial values)
// and g<i>.npy (its gradient at every step, [steps, ...shape]), float32 (a
// bf16 parameter's values are bf16 values). VARIANT: skewadam or
// skewadam-8bit. Steps FIRST..LAST-1 are taken (after --load, which also
// loads the parameter values); --save writes the state and the parameter
// values after them. Exit status 2 with a message on any error.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/checkpoint.hpp>
#include <skewadam/skewadam.hpp>
#include <skewadam/tiers/tier_assignment.hpp>
#include <skewadam_tools/npy.hpp>

namespace {

using namespace skewadam;
using tools::NpyArray;
using tools::read_npy;

/// The model: names (the default tier rules place them), dtypes, shapes. The
/// Python half builds the same one, in this order.
struct ParamSpec {
  const char* name;
  Dtype dtype;
};
constexpr ParamSpec model[] = {
    {"embed.weight", Dtype::f32},
    {"layers.0.attn.proj.weight", Dtype::bf16},
    {"layers.0.experts.w_in", Dtype::f32},
    {"layers.0.router.weight", Dtype::f32},
    {"norm.bias", Dtype::f32},
};

/// The hyperparameters and options both halves use.
Hyperparameters hyper() {
  Hyperparameters h;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.999;
  h.eps = 1e-8;
  h.weight_decay = 0.01;
  h.clip_threshold = 1.0;
  h.clip_scope = ClipScope::tensor;
  return h;
}
constexpr std::uint64_t seed = 1234;

/// One parameter's values and gradients in its dtype.
struct Param {
  Shape shape;
  Dtype dtype = Dtype::f32;
  std::vector<float> f32;
  std::vector<bf16> b16;
  std::vector<float> grads_f32;  // [steps * numel]
  std::vector<bf16> grads_b16;
  std::int64_t steps = 0;

  ParamView view() {
    if (dtype == Dtype::bf16) return TensorView<bf16>(b16.data(), shape);
    return TensorView<float>(f32.data(), shape);
  }
  GradView grad(std::int64_t t) const {
    const index_t n = shape.numel();
    if (dtype == Dtype::bf16) return TensorView<const bf16>(grads_b16.data() + t * n, shape);
    return TensorView<const float>(grads_f32.data() + t * n, shape);
  }
};

std::vector<bf16> to_bf16(const std::vector<float>& v, const std::string& what) {
  std::vector<bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    out[i] = bf16(v[i]);
    if (!(static_cast<float>(out[i]) == v[i]) && !(v[i] != v[i]))
      throw std::invalid_argument(what + ": element " + std::to_string(i) + " is not a bf16 value");
  }
  return out;
}

Param load_param(const std::filesystem::path& dir, std::size_t i) {
  const ParamSpec& spec = model[i];
  const NpyArray p = read_npy(dir / ("p" + std::to_string(i) + ".npy"));
  const NpyArray g = read_npy(dir / ("g" + std::to_string(i) + ".npy"));
  Param out;
  out.shape = Shape(p.shape.begin(), static_cast<index_t>(p.shape.size()), spec.name);
  if (g.shape.size() != p.shape.size() + 1 || !std::equal(p.shape.begin(), p.shape.end(), g.shape.begin() + 1))
    throw std::invalid_argument(std::string(spec.name) + ": the gradients' shape is not [steps, ...shape]");
  out.steps = g.shape[0];
  out.dtype = spec.dtype;
  if (spec.dtype == Dtype::bf16) {
    out.b16 = to_bf16(p.data, std::string(spec.name) + " values");
    out.grads_b16 = to_bf16(g.data, std::string(spec.name) + " gradients");
  } else {
    out.f32 = p.data;
    out.grads_f32 = g.data;
  }
  return out;
}

template <class Opt>
int run(const std::filesystem::path& dir, std::int64_t first, std::int64_t last, const std::string& load,
        const std::string& save) {
  std::vector<Param> params;
  for (std::size_t i = 0; i < std::size(model); ++i) params.push_back(load_param(dir, i));
  const Hyperparameters h = hyper();
  Opt opt(PerTier<Hyperparameters>{h, h, h}, OptimizerOptions{.seed = seed, .threads = 2});
  const TierAssigner tiers;
  std::vector<ParamId> ids;
  for (std::size_t i = 0; i < params.size(); ++i)
    ids.push_back(opt.add(model[i].name, tiers.assign(model[i].name), params[i].view()));
  if (!load.empty()) load_checkpoint(opt, load, LoadOptions{.params = ParamValues::require});
  if (opt.steps() != first)
    throw std::invalid_argument("FIRST " + std::to_string(first) + ": the optimizer is at step " +
                                std::to_string(opt.steps()));
  for (std::int64_t t = first; t < last; ++t) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (t >= params[i].steps) throw std::invalid_argument("LAST: the gradients hold fewer steps");
      opt.set_grad(ids[i], params[i].grad(t));
    }
    opt.step();
    if (!opt.last_step().applied) throw std::runtime_error("step " + std::to_string(t + 1) + " was skipped");
  }
  if (!save.empty()) save_checkpoint(opt, save, SaveOptions{.include_params = true});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 5)
      throw std::invalid_argument("usage: skewadam-checkpoint-interop DIR VARIANT FIRST LAST [--load F] [--save F]");
    const std::filesystem::path dir = argv[1];
    const std::string variant = argv[2];
    const std::int64_t first = std::stoll(argv[3]), last = std::stoll(argv[4]);
    std::string load, save;
    for (int i = 5; i < argc; i += 2) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(flag + ": needs a file");
      if (flag == "--load") load = argv[i + 1];
      else if (flag == "--save") save = argv[i + 1];
      else throw std::invalid_argument("unknown argument '" + flag + "'");
    }
    if (first < 0 || last < first) throw std::invalid_argument("FIRST and LAST: need 0 <= FIRST <= LAST");
    if (variant == "skewadam") return run<Optimizer<SkewAdamTiers>>(dir, first, last, load, save);
    if (variant == "skewadam-8bit") return run<Optimizer<SkewAdam8bitTiers>>(dir, first, last, load, save);
    throw std::invalid_argument("VARIANT '" + variant + "': expected skewadam or skewadam-8bit");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skewadam-checkpoint-interop: %s\n", e.what());
    return 2;
  }
}
