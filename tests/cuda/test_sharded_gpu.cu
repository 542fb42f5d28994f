// The sharded CUDA engine on a GPU against the local one, on the mixed model
// of ../mpi/sharded_checks.hpp (its buffers in CUDA managed memory):
//   --comm mpi    under mpirun, the ranks sharing the first GPU
//   --comm nccl   one rank over an NCCL communicator
// Exits 77 (skipped) on a machine without a CUDA device.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

struct ManagedMemory {
  template <class T>
  struct allocator {
    using value_type = T;
    allocator() = default;
    template <class U>
    allocator(const allocator<U>&) noexcept {}
    T* allocate(std::size_t n) {
      void* p = nullptr;
      if (cudaMallocManaged(&p, n * sizeof(T)) != cudaSuccess) throw std::bad_alloc();
      return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t) noexcept { cudaFree(p); }
    template <class U>
    bool operator==(const allocator<U>&) const noexcept {
      return true;
    }
  };
  static void sync() {
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize failed");
  }
};
#define SKEWADAM_SHARDED_TEST_MEMORY ManagedMemory
#include "../mpi/sharded_checks.hpp"

#include <skewadam/cuda.cuh>
#if defined(SKEWADAM_TEST_WITH_MPI)
#include <skewadam/mpi/communicator.hpp>
#endif
#if defined(SKEWADAM_TEST_WITH_NCCL)
#include <skewadam/nccl/communicator.hpp>
#endif

int main(int argc, char** argv) {
  using namespace skewadam;
  const std::string comm_kind = argc > 2 && std::string(argv[1]) == "--comm" ? argv[2] : "";
  if (comm_kind != "mpi" && comm_kind != "nccl") {
    std::fprintf(stderr, "usage: %s --comm mpi|nccl\n", argv[0]);
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  if (comm_kind == "mpi") {
#if defined(SKEWADAM_TEST_WITH_MPI)
    mpi::Environment env(argc, argv);
    mpi::MpiCommunicator comm;
    const int failed = sharded_test::run<cuda::Backend>(comm);
    if (comm.rank() == 0)
      std::printf("%s: sharded on the GPU over %d MPI ranks against one process, %d failed checks\n",
                  failed ? "FAIL" : "PASS", comm.size(), failed);
    return failed ? 1 : 0;
#else
    std::printf("built without MPI: skipped\n");
    return 77;
#endif
  }
#if defined(SKEWADAM_TEST_WITH_NCCL)
  ncclComm_t nc;
  int dev = 0;
  nccl::detail::check(ncclCommInitAll(&nc, 1, &dev), "ncclCommInitAll");
  cudaStream_t stream;
  nccl::detail::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  int failed = 0;
  {
    nccl::NcclCommunicator comm(nc, stream);
    failed = sharded_test::run<cuda::Backend>(comm);
  }
  cudaStreamDestroy(stream);
  ncclCommDestroy(nc);
  std::printf("%s: sharded on the GPU over NCCL at one rank against one process, %d failed checks\n",
              failed ? "FAIL" : "PASS", failed);
  return failed ? 1 : 0;
#else
  std::printf("built without NCCL: skipped\n");
  return 77;
#endif
}
