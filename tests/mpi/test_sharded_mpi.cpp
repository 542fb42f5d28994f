// The sharded optimizer over MPI against the single-process one, on the mixed
// model of sharded_checks.hpp; under mpirun with 2..4 ranks. With --backend
// cuda-emulated, the sharded placement over the CUDA backend
// (engine/backend/cuda/cuda_backend.hpp) against the local one, their kernels
// emulated on the host.

#include <skewadam_tools/emulated_runtime.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include <skewadam/mpi/communicator.hpp>
#include <skewadam/engine/placement/sharded.hpp>

struct HostBuffers {
  template <class T>
  using allocator = std::allocator<T>;
  static void sync() {}
};
#define SKEWADAM_SHARDED_TEST_MEMORY HostBuffers
#include "sharded_checks.hpp"

int main(int argc, char** argv) {
  using namespace skewadam;
  mpi::Environment env(argc, argv);
  mpi::MpiCommunicator comm;
  const std::string which = argc > 2 && std::string(argv[1]) == "--backend" ? argv[2] : "cpu";
  if (which != "cpu" && which != "cuda-emulated") {
    if (comm.rank() == 0) std::fprintf(stderr, "--backend %s: expected cpu or cuda-emulated\n", which.c_str());
    return 2;
  }
  const int failed = which == "cpu" ? sharded_test::run<backend::DefaultBackend>(comm)
                                      : sharded_test::run<tools::EmulatedCuda>(comm);
  if (comm.rank() == 0)
    std::printf("%s: sharded over %d ranks against one process (%s), %d failed checks\n", failed ? "FAIL" : "PASS",
                comm.size(), which == "cpu" ? "CPU" : "CUDA backend, emulated", failed);
  return failed ? 1 : 0;
}
