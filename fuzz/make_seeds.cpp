// skewadam-fuzz-seeds DIR: writes the checkpoint fuzzer's seed corpus (valid
// checkpoints of the fuzz fixture) to DIR. The copies under
// tests/data/checkpoint/ were written by it.

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include <skewadam/checkpoint.hpp>

#include "fuzz_fixture.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: skewadam-fuzz-seeds DIR\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    fuzz::Fixture f;
    skewadam::save_checkpoint(f.opt, dir / "fresh.ckpt");
    f.train(2);
    skewadam::save_checkpoint(f.opt, dir / "state.ckpt");
    skewadam::save_checkpoint(f.opt, dir / "state-params-metadata.ckpt",
                              skewadam::SaveOptions{.include_params = true, .metadata = {{"run", "fuzz"}, {"k", ""}}});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "skewadam-fuzz-seeds: %s\n", e.what());
    return 2;
  }
}
