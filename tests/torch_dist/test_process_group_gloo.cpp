// Sharding over a torch process group, on the CPU with Gloo: N processes
// (forked here, N from the command line) meet through a FileStore.
//
// Checks, on every rank:
//   - ProcessGroupCommunicator: gathers (equal and unequal counts, zero bytes
//     included) in rank order, sums, broadcast from a non-zero root, bad
//     arguments refused before anything is sent;
//   - the sharded optimizer's whole suite (tests/mpi/sharded_checks.hpp) over
//     that communicator;
//   - skewadam::libtorch::Optimizer with Options::process_group against the
//     unsharded adapter on the same averaged gradients: parameters bit for bit
//     where no rank shares a matrix, within the golden tolerances where
//     matrices are cut into row slices; every rank holds the complete
//     parameters after step(); state bytes per rank as the shard plan says;
//     state() views this rank's share; a non-finite gradient skips the step
//     on every rank, naming it; clipping and a learning-rate change; the
//     archive moves from N ranks to a fresh sharded optimizer and to one
//     process, and the runs continue bit for bit; parameters on a device
//     with no sharded engine built in are refused, naming the device.
//
// With --device-engine the adapter's checks run over the device engines,
// the path of CUDA tensors (torch/core.hpp's factories, as torch/cuda.cuh
// registers them for CUDA): the CUDA backend on the emulated runtime,
// registered for CPU tensors, sharded and, for the reference, in one process.
//
//   skewadam-torch-gloo-tests [--ranks N] [--device-engine]   (N in 1..8, default 2)

#include <skewadam/torch/process_group.hpp>  // first: the header compiles alone
#include <skewadam/torch/optimizer.hpp>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "../unit_torch/emulated_device_cores.hpp"

struct HostBuffers {
  template <class T>
  using allocator = std::allocator<T>;
  static void sync() {}
};
#define SKEWADAM_SHARDED_TEST_MEMORY HostBuffers
#include "../mpi/sharded_checks.hpp"
#include "../unit_torch/torch_test_support.hpp"

namespace {

using skewadam::libtorch::ProcessGroupCommunicator;
using namespace skewadam_torch_test;
using sharded_test::compare_arrays;

#define EXPECT(cond, what) SHARDED_EXPECT(cond, what)

template <class F>
bool throws_invalid(F&& f, const std::string& part) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return std::string(e.what()).find(part) != std::string::npos;
  }
  return false;
}

// ----------------------------------------------------------- communicator
void communicator_checks(ProcessGroupCommunicator& comm) {
  const int r = comm.rank(), n = comm.size();
  const auto un = static_cast<std::size_t>(n);
  {
    std::vector<std::uint8_t> mine(5), all(5 * un);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<std::uint8_t>(10 * r + static_cast<int>(i));
    comm.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
    bool ok = true;
    for (int k = 0; k < n; ++k)
      for (int i = 0; i < 5; ++i) ok &= all[static_cast<std::size_t>(5 * k + i)] == 10 * k + i;
    EXPECT(ok, "all_gather: every rank's bytes in rank order");
  }
  {
    std::vector<std::size_t> counts(un);
    for (int k = 0; k < n; ++k) counts[static_cast<std::size_t>(k)] = static_cast<std::size_t>(k == 0 ? 0 : 2 * k + 1);
    std::vector<std::uint8_t> mine(counts[static_cast<std::size_t>(r)], static_cast<std::uint8_t>(r + 1));
    std::size_t total = 0;
    for (auto c : counts) total += c;
    std::vector<std::uint8_t> all(total, 0xff);
    comm.all_gather_v(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)), counts);
    bool ok = true;
    std::size_t at = 0;
    for (int k = 0; k < n; ++k)
      for (std::size_t i = 0; i < counts[static_cast<std::size_t>(k)]; ++i) ok &= all[at++] == k + 1;
    EXPECT(ok, "all_gather_v: unequal counts (rank 0 sends none), in rank order");
    std::vector<std::size_t> too_many = counts;
    too_many.push_back(0);
    EXPECT(throws_invalid([&] { comm.all_gather_v(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                                                  too_many); },
                          "counts: has"),
           "all_gather_v: a counts array of the wrong length is refused, naming it");
  }
  {
    std::vector<double> d{static_cast<double>(r + 1), 0.5};
    comm.all_reduce_sum(std::span<double>(d));
    EXPECT(d[0] == n * (n + 1) / 2.0 && d[1] == 0.5 * n, "all_reduce_sum (double)");
    std::vector<float> f{1.0f};
    comm.all_reduce_sum(std::span<float>(f));
    EXPECT(f[0] == static_cast<float>(n), "all_reduce_sum (float)");
  }
  {
    std::vector<std::uint8_t> b(7, static_cast<std::uint8_t>(r));
    comm.broadcast(std::as_writable_bytes(std::span(b)), n - 1);
    bool ok = true;
    for (auto x : b) ok &= x == n - 1;
    EXPECT(ok, "broadcast from the last rank");
    EXPECT(throws_invalid([&] { comm.broadcast(std::as_writable_bytes(std::span(b)), n); }, "root"),
           "broadcast: a root outside the group is refused");
    std::vector<std::uint8_t> wrong(3);
    EXPECT(throws_invalid([&] { comm.all_gather(std::as_bytes(std::span(b)), std::as_writable_bytes(std::span(wrong))); },
                          "all:"),
           "all_gather: a wrong output size is refused");
  }
  EXPECT(throws_invalid([] { ProcessGroupCommunicator none{ProcessGroupCommunicator::Group()}; }, "group"), "a null group is refused");
  comm.barrier();
}

// ------------------------------------------------------- the LibTorch adapter
skewadam::libtorch::Options adapter_options() {
  skewadam::libtorch::Options o = test_options(/*seed=*/11);
  o.threads = 1;
  return o;
}

/// The averaged gradients of step k over `ranks` ranks: every rank's own
/// gradient (fixed by k and the rank) summed in rank order, over the rank
/// count; the same bits on every rank, as after a data-parallel all-reduce.
std::vector<torch::Tensor> averaged_grads(const Named& ps, int k, int ranks) {
  std::vector<torch::Tensor> sum;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<torch::Tensor> g = grads_for_step(ps, 100 * k + r, ps.size());  // (none skipped)
    for (std::size_t i = 0; i < g.size(); ++i) {
      const torch::Tensor f = g[i].to(torch::kFloat);
      if (r == 0) sum.push_back(f);
      else sum[i] = sum[i] + f;
    }
  }
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = (sum[i] / static_cast<double>(ranks)).to(ps[i].second.scalar_type());
  if (k % 3 == 0) sum[2] = torch::Tensor();  // a parameter without a gradient this step
  return sum;
}

std::vector<float> floats(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// With --device-engine: the emulated CUDA engines (emulated_device_cores.hpp) run the adapter.
bool device_engine = false;  // --device-engine

template <class Sharded>
void compare_params(const Sharded& opt, const Named& got, const Named& want, const std::string& when) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool exact = !opt.split(got[i].first).cuts_matrices();
    compare_arrays(got[i].first + " " + when, floats(got[i].second), floats(want[i].second), exact,
                   got[i].second.scalar_type() != torch::kFloat);
  }
}

std::string archive_bytes(const skewadam::libtorch::SkewAdam& opt) {
  std::ostringstream out;
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  archive.save_to(out);
  return out.str();
}

void load_archive(skewadam::libtorch::SkewAdam& opt, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  opt.load(archive);
}

void adapter_checks(ProcessGroupCommunicator& comm, const std::filesystem::path& dir) {
  using skewadam::libtorch::SkewAdam;
  const int n = comm.size();
  Named sharded_params = make_params();
  Named single_params = clone(sharded_params);
  skewadam::libtorch::Options so = adapter_options();
  so.process_group = comm.group();
  so.max_grad_norm = 0.05;
  skewadam::libtorch::Options lo = adapter_options();
  lo.max_grad_norm = 0.05;
  SkewAdam sharded(sharded_params, so);
  SkewAdam single(single_params, lo);
  EXPECT(sharded.sharded() && sharded.rank() == comm.rank() && sharded.ranks() == n, "the optimizer is sharded");
  EXPECT(!single.sharded() && single.ranks() == 1, "without a group it is not");
  {
    bool cpu_front_end = true;
    try {
      (void)sharded.sharded_core();
    } catch (const std::logic_error&) {
      cpu_front_end = false;
    }
    EXPECT(cpu_front_end != device_engine, device_engine ? "the sharded device engine runs the steps"
                                                          : "the CPU's sharded front-end runs the steps");
  }

  auto step_both = [&](int k) {
    const std::vector<torch::Tensor> g = averaged_grads(sharded_params, k, n);
    set_grads(sharded_params, g);
    set_grads(single_params, g);
    sharded.step();
    single.step();
  };
  for (int k = 1; k <= 4; ++k) step_both(k);
  compare_params(sharded, sharded_params, single_params, "after 4 steps");
  for (skewadam::Tier t : skewadam::all_tiers) {
    sharded.group_options(t).set_lr(sharded.group_options(t).get_lr() * 0.5);  // as a scheduler does
    single.group_options(t).set_lr(single.group_options(t).get_lr() * 0.5);
  }
  for (int k = 5; k <= 6; ++k) step_both(k);
  compare_params(sharded, sharded_params, single_params, "after a learning-rate change");
  EXPECT(sharded.steps() == single.steps() && sharded.steps() == 6, "step counts");
  for (const auto& name : sharded.names())
    EXPECT(sharded.param_state(name).step == single.param_state(name).step, name + ": step count");

  // every rank holds the same, complete parameters
  for (const auto& [name, t] : sharded_params) {
    const std::vector<float> mine = floats(t);
    std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
    skewadam::dist::all_gather_values<ProcessGroupCommunicator, float>(comm, mine, all);
    bool same = true;
    for (int r = 1; r < n; ++r)
      same &= std::memcmp(all.data(), all.data() + mine.size() * static_cast<std::size_t>(r), mine.size() * 4) == 0;
    EXPECT(same, name + ": every rank holds the same parameter after step()");
  }

  // state bytes and state() views: this rank's share, as the plan says
  skewadam::index_t planned = 0;
  for (const auto& name : sharded.names()) {
    const skewadam::libtorch::Core& core = sharded.engine_core();
    planned += skewadam::dist::shard_state_bytes(sharded.split(name),
                                                 skewadam::SkewAdamTiers::layout(sharded.tier(name)), comm.rank());
    const skewadam::ParamStateView mine = core.state(*core.find(name));
    const auto& view = sharded.param_state(name);
    EXPECT(view.bytes() == static_cast<std::int64_t>(4 * (mine.m.size() + mine.v.size() + mine.v_row.size() +
                                                          mine.v_col.size())),
           name + ": state() views this rank's share");
    if (view.m.defined()) EXPECT(view.m.data_ptr<float>() == mine.m.data(), name + ": state().m is no copy");
  }
  EXPECT(planned == sharded.state_bytes(), "state_bytes() is the shard plan's");
  if (n > 1) EXPECT(sharded.state_bytes() < single.state_bytes(), "a rank keeps less state than one process");

  // a non-finite gradient: the step is skipped on every rank, naming it
  {
    std::vector<torch::Tensor> g = averaged_grads(sharded_params, 7, n);
    g[0] = g[0].clone();
    g[0].view(-1)[g[0].numel() - 3] = std::numeric_limits<float>::infinity();  // in the last rank's rows
    const Named before = clone(sharded_params);
    set_grads(sharded_params, g);
    sharded.step();
    EXPECT(!sharded.last_step().applied && sharded.last_step().nonfinite &&
               sharded.last_step().nonfinite->name == sharded_params[0].first,
           "a non-finite gradient skips the step on every rank and names the parameter");
    EXPECT(same_bits(before, sharded_params) && sharded.steps() == 6, "and changes nothing");
  }

  // checkpoints: rank 0 saves after consolidating; the archive resumes a
  // fresh sharded optimizer and one process, bit for bit
  {
    bool refused = false;
    try {
      (void)archive_bytes(sharded);
    } catch (const std::logic_error& e) {
      refused = std::string(e.what()).find(comm.rank() == 0 ? "consolidate_checkpoint" : "rank 0 saves") !=
                std::string::npos;
    }
    EXPECT(refused, "save() without consolidating (or off rank 0) is refused, saying why");
  }
  sharded.consolidate_checkpoint();
  const std::filesystem::path file = dir / "optimizer.pt";
  if (comm.rank() == 0) torch::save(sharded, file.string());
  comm.barrier();
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  Named resumed_params = clone(sharded_params);
  SkewAdam resumed(resumed_params, so);
  load_archive(resumed, bytes);
  Named one_params = clone(sharded_params);
  SkewAdam one(one_params, lo);
  load_archive(one, bytes);
  EXPECT(resumed.steps() == 6 && one.steps() == 6, "loaded step counts");
  for (int k = 8; k <= 10; ++k) {
    const std::vector<torch::Tensor> g = averaged_grads(sharded_params, k, n);
    set_grads(sharded_params, g);
    set_grads(resumed_params, g);
    set_grads(one_params, g);
    sharded.step();
    resumed.step();
    one.step();
  }
  EXPECT(same_bits(sharded_params, resumed_params), "a resumed sharded run continues bit for bit");
  compare_params(sharded, one_params, sharded_params, "in one process, resumed from the sharded archive");

  // expert banks cut into rows, like the backbone
  {
    Named rows_params = make_params();
    Named ref_params = clone(rows_params);
    skewadam::libtorch::Options ro = adapter_options();
    ro.process_group = comm.group();
    ro.expert_sharding = skewadam::dist::ExpertSharding::rows;
    SkewAdam rows(rows_params, ro);
    SkewAdam ref(ref_params, adapter_options());
    for (int k = 1; k <= 3; ++k) {
      const std::vector<torch::Tensor> g = averaged_grads(rows_params, k, n);
      set_grads(rows_params, g);
      set_grads(ref_params, g);
      rows.step();
      ref.step();
    }
    EXPECT(rows.split("blocks.1.moe.experts.gate_proj").split == skewadam::dist::Split::rows,
           "expert_sharding = rows cuts the bank");
    compare_params(rows, rows_params, ref_params, "with experts cut into rows");
  }

  // parameters on a device for which no sharded engine is built in
  {
    Named meta;
    meta.emplace_back("blocks.0.attn.qkv.weight", torch::empty({8, 4}, torch::TensorOptions().device(torch::kMeta)));
    EXPECT(throws_invalid([&] { SkewAdam refused(meta, so); }, "the parameters are on meta, and no sharded engine"),
           "a device without a sharded engine is refused, naming it");
  }
}

int run_rank(int rank, int ranks, const std::filesystem::path& dir) {
  sharded_test::rank_ = rank;
  auto store = c10::make_intrusive<::c10d::FileStore>((dir / "store").string(), ranks);
  auto options = ::c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(120));
  options->devices.push_back(::c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, ranks, options);
  ProcessGroupCommunicator comm(group);
  communicator_checks(comm);
  // all ranks' failures (the sharded suite over the emulated CUDA engine runs under MPI)
  const int suite = device_engine ? 0 : sharded_test::run<skewadam::backend::DefaultBackend>(comm);
  if (suite != 0 && rank == 0) std::fprintf(stderr, "the sharded suite failed %d checks over the ranks\n", suite);
  sharded_test::failures = 0;
  adapter_checks(comm, dir);
  std::vector<int> all(static_cast<std::size_t>(ranks));
  skewadam::dist::all_gather_values<ProcessGroupCommunicator, int>(comm, std::span<const int>(&sharded_test::failures, 1),
                                                                   std::span<int>(all));
  int total = suite;
  for (int f : all) total += f;
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (a == "--device-engine") {
      device_engine = true;
    } else {
      std::fprintf(stderr, "usage: %s [--ranks N] [--device-engine]\n", argv[0]);
      return 2;
    }
  }
  if (device_engine) {
    using skewadam::SkewAdamTiers;
    skewadam::libtorch::register_device_core<SkewAdamTiers>("cpu", &make_emulated_core<SkewAdamTiers>);
    skewadam::libtorch::register_sharded_device_core<SkewAdamTiers>("cpu", &make_emulated_sharded_core<SkewAdamTiers>);
  }
  if (ranks < 1 || ranks > 8) {
    std::fprintf(stderr, "--ranks %d: must be in 1..8\n", ranks);
    return 2;
  }
  std::string pattern = (std::filesystem::temp_directory_path() / "skewadam-gloo-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::filesystem::path dir = pattern;
  // one process per rank, forked before anything of torch runs here
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t c : children) ::kill(c, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      int failed = 1;
      try {
        failed = run_rank(r, ranks, dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(failed == 0 ? 0 : 1);
    }
    children.push_back(pid);
  }
  // a failed rank stops the others (they would wait for it until the timeout)
  bool ok = true;
  for (std::size_t left = children.size(); left > 0; --left) {
    int status = 0;
    const pid_t done = ::wait(&status);
    if (done < 0) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (ok) std::fprintf(stderr, "a rank failed (%s %d); stopping the others\n",
                           WIFEXITED(status) ? "exit status" : "signal",
                           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      ok = false;
      for (pid_t c : children)
        if (c != done) ::kill(c, SIGKILL);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf("%s: sharded over %d Gloo ranks against one process%s\n", ok ? "PASS" : "FAIL", ranks,
              device_engine ? ", on the sharded device engine (emulated)" : "");
  return ok ? 0 : 1;
}
