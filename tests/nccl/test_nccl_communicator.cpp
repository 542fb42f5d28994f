// NcclCommunicator on one GPU (SKEWADAM_WITH_NCCL): every collective of the
// Communicator concept round-trips through the device, and a ShardedOptimizer
// over it gives the single-process optimizer's bits. Exits 77 (skipped) on a
// machine without a CUDA device.

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <skewadam/dist/sharded_optimizer.hpp>
#include <skewadam/nccl/communicator.hpp>
#include <skewadam/skewadam.hpp>

int main() {
  using namespace skewadam;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "FAILED: %s\n", what);
    }
  };
  ncclComm_t nc;
  int dev = 0;
  nccl::detail::check(ncclCommInitAll(&nc, 1, &dev), "ncclCommInitAll");
  cudaStream_t stream;
  nccl::detail::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  {
    nccl::NcclCommunicator comm(nc, stream);
    expect(comm.rank() == 0 && comm.size() == 1, "rank 0 of 1");
    std::vector<float> f{1.5f, -2.0f, 3.25f};
    comm.all_reduce_sum(std::span<float>(f));
    expect(f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.25f, "all_reduce_sum of one rank is the identity");
    std::vector<double> in{0.125, 7.0}, out(2);
    dist::all_gather_values<nccl::NcclCommunicator, double>(comm, std::span<const double>(in), std::span<double>(out));
    expect(out == in, "all_gather");
    std::vector<std::byte> bytes(5, std::byte{9}), back(5);
    const std::size_t counts[] = {5};
    comm.all_gather_v(bytes, back, counts);
    expect(back == bytes, "all_gather_v");
    comm.broadcast(back, 0);
    expect(back == bytes, "broadcast");
    comm.barrier();

    std::vector<float> a(40 * 24), b, g(a.size());
    std::mt19937 gen(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& x : a) x = d(gen);
    b = a;
    SkewAdam single(Hyperparameters{.lr = 1e-2});
    single.add("w", Tier::backbone, TensorView<float>(a.data(), {40, 24}), TensorView<const float>(g.data(), {40, 24}));
    dist::ShardedOptimizer<SkewAdamTiers, nccl::NcclCommunicator> sharded(comm, Hyperparameters{.lr = 1e-2});
    sharded.add("w", Tier::backbone, TensorView<float>(b.data(), {40, 24}), TensorView<const float>(g.data(), {40, 24}));
    for (int s = 0; s < 3; ++s) {
      for (auto& x : g) x = d(gen);
      single.step();
      sharded.step();
    }
    expect(std::memcmp(a.data(), b.data(), a.size() * 4) == 0, "sharded over NCCL equals one process");
  }
  ncclCommDestroy(nc);
  cudaStreamDestroy(stream);
  std::printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
