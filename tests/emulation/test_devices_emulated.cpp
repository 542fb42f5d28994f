// The optimizer's device and the allocator of its memory
// (OptimizerOptions::device, ::device_allocator) on the CUDA backend over the
// emulated runtime, which places each allocation on the device current at
// the time (emulated_runtime.hpp): a tensor of another device is refused,
// every call runs on the optimizer's device and gives the caller's back, and
// every byte the backend holds comes from the caller's allocator and goes
// back to it.

#include <doctest/doctest.h>

#include <skewadam_tools/emulated_runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>

#include "../support/device_floats.hpp"

namespace test_devices_emulated {

namespace {

using namespace skewadam;
using R = emu::Runtime;
using Emulated = Optimizer<SkewAdamTiers, tools::EmulatedCuda>;

using Floats = test::DeviceFloats<R>;

/// Floats of device memory on device d (allocated with d current; the
/// caller's device is left as it was), uploaded on the default stream.
Floats floats_on(int device, const std::vector<float>& values) {
  const backend::cuda::DeviceScope<R> scope(device);
  return Floats(values);
}

std::vector<float> values(std::size_t n, float scale, std::uint32_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale * static_cast<float>(static_cast<int>((i * 2654435761u + seed) % 2001u) - 1000) / 1000.0f;
  return v;
}

/// A model of three tensors (one per tier) on one device: parameters and gradients.
struct Model {
  Floats w, gw, e, ge, r, gr;
  explicit Model(int device)
      : w(floats_on(device, values(48 * 40, 0.5f, 1))),
        gw(floats_on(device, values(48 * 40, 0.01f, 2))),
        e(floats_on(device, values(4 * 24 * 16, 0.5f, 3))),
        ge(floats_on(device, values(4 * 24 * 16, 0.02f, 4))),
        r(floats_on(device, values(8 * 40, 0.5f, 5))),
        gr(floats_on(device, values(8 * 40, 0.03f, 6))) {}
  template <class Opt>
  void register_with(Opt& opt) {
    const ParamId a = opt.add("backbone.w", Tier::backbone, TensorView<float>(w.d.data(), {48, 40}));
    const ParamId b = opt.add("experts.w", Tier::experts, TensorView<float>(e.d.data(), {4, 24, 16}));
    const ParamId c = opt.add("router.w", Tier::router, TensorView<float>(r.d.data(), {8, 40}));
    opt.set_grad(a, TensorView<const float>(gw.d.data(), {48, 40}));
    opt.set_grad(b, TensorView<const float>(ge.d.data(), {4, 24, 16}));
    opt.set_grad(c, TensorView<const float>(gr.d.data(), {8, 40}));
  }
  std::vector<float> params() const {
    std::vector<float> out = w.get();
    for (const Floats* f : {&e, &r}) {
      const std::vector<float> v = f->get();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
};

/// An allocator that counts what it holds, and fails on request.
struct Counting {
  std::map<void*, std::size_t> live;
  std::size_t allocations = 0, releases = 0;
  bool fail = false;

  std::size_t live_bytes() const {
    std::size_t b = 0;
    for (const auto& [p, n] : live) b += n;
    return b;
  }
  bool holds(const void* p) const {
    auto it = live.upper_bound(const_cast<void*>(p));
    if (it == live.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
  }
  DeviceAllocator allocator() {
    DeviceAllocator a;
    a.allocate = [](std::size_t bytes, void* self) -> void* {
      auto& c = *static_cast<Counting*>(self);
      if (c.fail) return nullptr;
      void* p = ::operator new(bytes, std::align_val_t{256});
      c.live[p] = bytes;
      ++c.allocations;
      return p;
    };
    a.release = [](void* p, void* self) noexcept {
      auto& c = *static_cast<Counting*>(self);
      c.live.erase(p);
      ++c.releases;
      ::operator delete(p, std::align_val_t{256});
    };
    a.context = this;
    return a;
  }
};

PerTier<Hyperparameters> hyper() {
  PerTier<Hyperparameters> h;
  h.backbone = Hyperparameters{.lr = 1e-2, .weight_decay = 0.05};
  h.experts = Hyperparameters{.lr = 2e-2, .clip_scope = ClipScope::matrix};
  h.router = Hyperparameters{.lr = 5e-3};
  return h;
}

}  // namespace

/// The call throws E whose message contains `words`.
#define THROWS(call, words, E) CHECK_THROWS_WITH_AS(call, doctest::Contains(std::string(words).c_str()), E)

TEST_CASE("devices: the optimizer keeps the device it was built on, and refuses another device's tensor, naming it") {
  R::set_device(0);
  Emulated opt(hyper());
  CHECK(opt.engine().backend().device() == 0);
  const Floats p1 = floats_on(1, values(6 * 5, 0.5f, 7)), g1 = floats_on(1, values(6 * 5, 0.01f, 8));
  const Floats p0 = floats_on(0, values(6 * 5, 0.5f, 7)), g0 = floats_on(0, values(6 * 5, 0.01f, 8));
  THROWS(opt.add("w", Tier::backbone, TensorView<float>(p1.d.data(), {6, 5})),
         "param of 'w': memory of device 1, and the optimizer's device is 0", std::invalid_argument);
  CHECK(opt.size() == 0);
  CHECK(opt.device_bytes() == Emulated(hyper()).device_bytes());  // nothing was allocated for it
  const ParamId id = opt.add("w", Tier::backbone, TensorView<float>(p0.d.data(), {6, 5}));
  THROWS(opt.set_grad(id, TensorView<const float>(g1.d.data(), {6, 5})),
         "grad of 'w': memory of device 1, and the optimizer's device is 0", std::invalid_argument);
  CHECK_FALSE(opt.grad(id).present());
  opt.set_grad(id, TensorView<const float>(g0.d.data(), {6, 5}));
  opt.step();
  CHECK(opt.last_step().applied);
  CHECK(opt.steps() == 1);
}

TEST_CASE("devices: each call runs on the optimizer's device and gives the caller's back, with the same bits") {
  R::set_device(0);
  Model here(0), there(2);
  Emulated on0(hyper()), on2(hyper(), {.device = 2});
  CHECK(R::current_device() == 0);
  CHECK(on2.engine().backend().device() == 2);
  here.register_with(on0);
  there.register_with(on2);
  CHECK(R::current_device() == 0);
  for (index_t i = 0; i < on2.size(); ++i) {  // the state was allocated on device 2
    const ParamStateView s = on2.state(ParamId{i});
    for (std::span<const float> a : {s.m, s.v, s.v_row, s.v_col})
      if (!a.empty()) CHECK(R::device_of(a.data()) == 2);
  }
  for (int t = 0; t < 3; ++t) {
    on0.step();
    CHECK(R::launched_on() == 0);
    on2.step();
    CHECK(R::launched_on() == 2);
    CHECK(R::current_device() == 0);
  }
  CHECK(on2.steps() == 3);
  CHECK(R::current_device() == 0);
  CHECK(on2.last_step().applied);
  CHECK(here.params() == there.params());
  const OptimizerState a = on0.export_state(), b = on2.export_state();
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    CHECK(a.params[i].state.v_row == b.params[i].state.v_row);
    CHECK(a.params[i].state.v_col == b.params[i].state.v_col);
    CHECK(a.params[i].state.v == b.params[i].state.v);
    CHECK(a.params[i].state.m == b.params[i].state.m);
  }
  CHECK(R::current_device() == 0);
}

TEST_CASE("devices: a device that is not there, or no device's index, is refused at construction") {
  THROWS(Emulated(hyper(), {.device = R::devices}), "device: " + std::to_string(R::devices), std::invalid_argument);
  THROWS(Emulated(hyper(), {.device = -2}), "device: -2", std::invalid_argument);
  CHECK(R::current_device() == 0);
}

TEST_CASE("allocator: every byte of the backend's memory comes from the caller's allocator, and goes back to it") {
  Counting c;
  {
    Model m(0);
    Emulated opt(hyper(), {.device_allocator = c.allocator()});
    CHECK(c.live_bytes() == static_cast<std::size_t>(opt.device_bytes()));
    m.register_with(opt);
    CHECK(c.live_bytes() == static_cast<std::size_t>(opt.device_bytes()));
    for (index_t i = 0; i < opt.size(); ++i) {
      const ParamStateView s = opt.state(ParamId{i});
      for (std::span<const float> a : {s.m, s.v, s.v_row, s.v_col})
        if (!a.empty()) CHECK(c.holds(a.data()));
    }
    opt.step();
    const std::size_t after_first = c.allocations;
    for (int t = 0; t < 3; ++t) opt.step();
    CHECK(c.allocations == after_first);  // a step allocates nothing
    // a loaded state goes into the allocator's memory too, and the old is given back
    opt.import_state(opt.export_state());
    CHECK(c.live_bytes() == static_cast<std::size_t>(opt.device_bytes()));
    for (index_t i = 0; i < opt.size(); ++i) {
      const ParamStateView s = opt.state(ParamId{i});
      for (std::span<const float> a : {s.m, s.v, s.v_row, s.v_col})
        if (!a.empty()) CHECK(c.holds(a.data()));
    }
    CHECK(opt.steps() == 4);
  }
  CHECK(c.live.empty());
  CHECK(c.allocations == c.releases);
  CHECK(c.allocations > 0);
}

TEST_CASE("allocator: half an allocator is refused, and one out of memory loses nothing") {
  DeviceAllocator half;
  half.allocate = [](std::size_t, void*) -> void* { return nullptr; };
  THROWS(Emulated(hyper(), {.device_allocator = half}), "device_allocator: allocate and release are set together",
         std::invalid_argument);

  Counting c;
  Model m(0), reference(0);
  Emulated opt(hyper(), {.device_allocator = c.allocator()}), plain(hyper());
  m.register_with(opt);
  reference.register_with(plain);
  opt.step();
  plain.step();
  const Floats extra = floats_on(0, values(32 * 16, 0.5f, 9));
  c.fail = true;
  THROWS(opt.add("extra", Tier::backbone, TensorView<float>(extra.d.data(), {32, 16})), "device_allocator: no memory",
         std::runtime_error);
  c.fail = false;
  CHECK(opt.size() == 3);
  CHECK_FALSE(opt.find("extra").has_value());
  CHECK(c.live_bytes() == static_cast<std::size_t>(opt.device_bytes()));
  opt.step();
  plain.step();
  CHECK(opt.last_step().applied);
  CHECK(m.params() == reference.params());
  CHECK(opt.add("extra", Tier::backbone, TensorView<float>(extra.d.data(), {32, 16})).index == 3);
  CHECK(c.live_bytes() == static_cast<std::size_t>(opt.device_bytes()));
}

}  // namespace test_devices_emulated
