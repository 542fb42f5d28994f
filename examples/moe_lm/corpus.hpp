#pragma once
// Text corpus for the MoE language model: byte-level tokens, a held-out
// split, and reproducible batches.
//
// Default corpus: the King James Bible as Debian's `bible-kjv` package prints
// it (`bible -f Gen1:1-Rev22:21`, verse references stripped). Any text file
// can be used instead.
//
// Split: the text is cut into blocks of 16 KiB; every 10th block is held out
// for validation, so both splits sample the whole text and no validation
// window overlaps training text.

#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace moe_lm {

struct Corpus {
  std::string source;  ///< where the text came from
  std::vector<std::uint8_t> train;
  std::vector<std::uint8_t> val;
};

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("--data " + path + ": cannot open the file");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The King James Bible, one verse per line, from the `bible` program.
inline std::string read_kjv() {
  const char* command = "bible -f Gen1:1-Rev22:21 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command, "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run `bible`");
  std::string raw;
  char buffer[1 << 16];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0) raw.append(buffer, got);
  if (raw.size() < 1000000)
    throw std::runtime_error(
        "the default corpus needs the `bible` program and its text (Debian: apt-get install bible-kjv); "
        "or pass --data FILE");
  // "Ge1:1 In the beginning ..." -> "In the beginning ..."
  std::string text;
  text.reserve(raw.size());
  std::istringstream lines(raw);
  std::string line;
  while (std::getline(lines, line)) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;
    text.append(line, space + 1, std::string::npos);
    text.push_back('\n');
  }
  return text;
}

inline Corpus split_corpus(const std::string& text, std::string source, std::size_t block = 16384,
                           std::size_t every = 10) {
  Corpus c;
  c.source = std::move(source);
  for (std::size_t b = 0, start = 0; start < text.size(); ++b, start += block) {
    const std::size_t end = std::min(text.size(), start + block);
    auto& dst = (b % every == every - 1) ? c.val : c.train;
    dst.insert(dst.end(), text.begin() + static_cast<std::ptrdiff_t>(start),
               text.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return c;
}

/// Loads `path`, or the King James Bible when `path` is empty.
inline Corpus load_corpus(const std::string& path, std::int64_t context) {
  Corpus c = path.empty() ? split_corpus(read_kjv(), "King James Bible (bible-kjv)")
                          : split_corpus(read_text_file(path), path);
  const auto need = static_cast<std::size_t>(context + 1);
  if (c.train.size() < 4 * need || c.val.size() < need)
    throw std::runtime_error("corpus " + c.source + ": too short (" + std::to_string(c.train.size() + c.val.size()) +
                             " bytes) for sequences of " + std::to_string(context) +
                             " tokens; it needs at least 10 blocks of 16 KiB");
  return c;
}

/// A batch of byte sequences and their next-byte targets, [B, T] each.
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

inline Batch make_batch(const std::vector<std::uint8_t>& data, const std::vector<std::size_t>& starts,
                        std::int64_t context) {
  const auto b = static_cast<std::int64_t>(starts.size());
  auto window = torch::empty({b, context + 1}, torch::kLong);
  auto* w = window.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j <= context; ++j)
      w[i * (context + 1) + j] = data[starts[static_cast<std::size_t>(i)] + static_cast<std::size_t>(j)];
  return {window.narrow(1, 0, context).contiguous(), window.narrow(1, 1, context).contiguous()};
}

/// Random training windows from a fixed seed: every run that uses the same
/// seed sees the same batches in the same order.
class BatchSampler {
 public:
  BatchSampler(const std::vector<std::uint8_t>& data, std::int64_t batch, std::int64_t context, std::uint64_t seed)
      : data_(&data), batch_(batch), context_(context), rng_(seed) {}

  Batch next() {
    const std::uint64_t range = data_->size() - static_cast<std::size_t>(context_);
    std::vector<std::size_t> starts(static_cast<std::size_t>(batch_));
    for (auto& s : starts) s = static_cast<std::size_t>(rng_() % range);
    return make_batch(*data_, starts, context_);
  }

 private:
  const std::vector<std::uint8_t>* data_;
  std::int64_t batch_, context_;
  std::mt19937_64 rng_;
};

/// Up to `windows` non-overlapping validation windows, evenly spread over the
/// held-out text, in batches of `batch`.
inline std::vector<Batch> validation_batches(const std::vector<std::uint8_t>& data, std::int64_t batch,
                                             std::int64_t context, std::int64_t windows) {
  const auto span = static_cast<std::size_t>(context + 1);
  const std::size_t available = data.size() / span;
  const std::size_t n = std::min<std::size_t>(available, static_cast<std::size_t>(windows));
  const std::size_t stride = available / n;
  std::vector<Batch> out;
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < n; ++i) {
    starts.push_back(i * stride * span);
    if (starts.size() == static_cast<std::size_t>(batch) || i + 1 == n) {
      out.push_back(make_batch(data, starts, context));
      starts.clear();
    }
  }
  return out;
}

}  // namespace moe_lm
