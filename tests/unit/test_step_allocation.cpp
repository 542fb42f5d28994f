// step() allocates nothing proportional to tensor size once the step's
// workspace (the row blocks' column partials, engine/backend/cpu/cpu_backend.hpp)
// has grown to the largest step's need, on the first step; what the backend
// keeps besides the state is then that workspace and O(rows + cols) per
// tensor, and a step inside backward, one tensor at a time, keeps only the
// largest tensor's. Checked with a counting global operator new (this file
// replaces it for the whole test executable; it only counts while a test
// switches it on).

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <skewadam/skewadam.hpp>

// ThreadSanitizer's runtime defines the global allocation functions itself
// (clang links it statically): the counting replacement cannot coexist with
// it, so under TSan this test is compiled out and reported as skipped.
#if defined(__SANITIZE_THREAD__)
#define SKEWADAM_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SKEWADAM_TEST_UNDER_TSAN 1
#endif
#endif

#if defined(SKEWADAM_TEST_UNDER_TSAN)
TEST_CASE("step() allocates nothing proportional to tensor size" * doctest::skip()) {}
#else
namespace {

std::atomic<bool> counting{false};
std::atomic<std::size_t> allocations{0};
std::atomic<std::size_t> allocated_bytes{0};
std::atomic<std::size_t> largest{0};

void count(std::size_t n) noexcept {
  if (!counting.load(std::memory_order_relaxed)) return;
  allocations.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(n, std::memory_order_relaxed);
  std::size_t prev = largest.load(std::memory_order_relaxed);
  while (n > prev && !largest.compare_exchange_weak(prev, n, std::memory_order_relaxed)) {
  }
}

void* allocate(std::size_t n, std::size_t align) {
  count(n);
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) p = std::malloc(n ? n : 1);
  else p = std::aligned_alloc(align, (n + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  return p;
}

struct Counted {
  std::size_t allocations = 0, bytes = 0, largest = 0;
};

template <class F>
Counted count_allocations(F&& f) {
  allocations = 0;
  allocated_bytes = 0;
  largest = 0;
  counting = true;
  f();
  counting = false;
  return {allocations.load(), allocated_bytes.load(), largest.load()};
}

}  // namespace

void* operator new(std::size_t n) { return allocate(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return allocate(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

TEST_CASE("step() allocates nothing proportional to tensor size") {
  using namespace skewadam;
  // ~25 MB of parameters over every tier and dtype, each tensor far larger
  // than the bound below.
  const Shape big{2048, 2048}, bank{4, 512, 640}, mat{1024, 1024}, router{256, 1024}, vec{1 << 18};
  std::vector<float> p1(big.numel()), g1(big.numel(), 1e-3f), p4(router.numel()), g4(router.numel(), 2e-3f);
  std::vector<bf16> p2(bank.numel()), g2(bank.numel(), bf16(1e-3f)), p3(mat.numel()), p5(vec.numel());
  std::vector<float> g3(mat.numel(), 1e-3f), g5(vec.numel(), 1e-3f);
  for (auto threads : {1, 2}) {
    CAPTURE(threads);
    SkewAdam opt(Hyperparameters{.lr = 1e-3, .weight_decay = 0.05}, OptimizerOptions{.threads = threads});
    opt.add("experts.big", Tier::experts, TensorView<float>(p1.data(), big), TensorView<const float>(g1.data(), big));
    opt.add("experts.bank", Tier::experts, TensorView<bf16>(p2.data(), bank), TensorView<const bf16>(g2.data(), bank));
    opt.add("backbone.w", Tier::backbone, TensorView<bf16>(p3.data(), mat), TensorView<const float>(g3.data(), mat));
    opt.add("router", Tier::router, TensorView<float>(p4.data(), router), TensorView<const float>(g4.data(), router));
    opt.add("backbone.norm", Tier::backbone, TensorView<bf16>(p5.data(), vec), TensorView<const float>(g5.data(), vec));
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      const index_t scratch_before = opt.scratch_bytes();
      const Counted c = count_allocations([&] { opt.step(); });
      const auto workspace = static_cast<std::size_t>(opt.scratch_bytes() - scratch_before);
      CAPTURE(c.allocations);
      CAPTURE(c.bytes);
      CAPTURE(c.largest);
      CAPTURE(workspace);
      // Per-step bookkeeping grows with the number of tensors and work units
      // (a few kB here), never with their size; the first step also
      // allocates the workspace, once, in one block: the column sums and
      // D_j of the row blocks of each matrix cut into several (experts.big:
      // 16 of 2048 columns, backbone.w: 4 of 1024), and the statistics of the
      // experts, saved for the non-finite check (B (r + c) floats each).
      const std::size_t want = 4 * (2 * 16 * 2048 + 2 * 4 * 1024 + (2048 + 2048) + 4 * (512 + 640));
      CHECK(workspace == (step == 0 ? want : 0));
      CHECK(c.bytes < 256 * 1024 + workspace);
      CHECK(c.largest <= std::max<std::size_t>(64 * 1024, workspace));
      if (step > 0) CHECK(c.allocations == 0);  // the lists and the workspace are reused
    }
  }
}

TEST_CASE("stepping inside backward, the backend keeps besides the state only the largest tensor's workspace") {
  using namespace skewadam;
  // Eight expert matrices of 1024 x 1024, each cut into 4 row blocks: a
  // whole step's workspace holds all eight's column partials, a step of one
  // tensor at a time one's.
  const Shape shape{1024, 1024};
  std::vector<std::vector<float>> p(8, std::vector<float>(shape.numel())), g(8, std::vector<float>(shape.numel(), 1e-3f));
  SkewAdam inside(Hyperparameters{.lr = 1e-3}, OptimizerOptions{.threads = 1});
  SkewAdam whole(Hyperparameters{.lr = 1e-3}, OptimizerOptions{.threads = 1});
  std::vector<ParamId> ids;
  for (std::size_t k = 0; k < p.size(); ++k) {
    const std::string name = "experts." + std::to_string(k);
    ids.push_back(inside.add(name, Tier::experts, TensorView<float>(p[k].data(), shape),
                             TensorView<const float>(g[k].data(), shape)));
    whole.add(name, Tier::experts, TensorView<float>(p[k].data(), shape), TensorView<const float>(g[k].data(), shape));
  }
  const index_t before = inside.scratch_bytes();
  REQUIRE(before == whole.scratch_bytes());
  for (int step = 0; step < 2; ++step) {
    for (ParamId id : ids) inside.step(id);
    inside.finish_step();
    whole.step();
  }
  // one tensor: 4 row blocks' c column sums and c terms D_j, and its
  // statistics saved for the non-finite check
  const index_t one = 4 * (2 * 4 * 1024 + 2 * 1024);
  CHECK(inside.scratch_bytes() - before == one);
  CHECK(whole.scratch_bytes() - before == 8 * one);
  CHECK(before < 64 * 1024);  // the rest: O(tensors + threads x columns), a few tens of kB
}
#endif  // SKEWADAM_TEST_UNDER_TSAN
