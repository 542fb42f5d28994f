#pragma once
// Writing a checkpoint: records with their CRC-32C trailers, and save(), which
// streams an optimizer's state into a sink (file_io.hpp) in the format of
// format.hpp.

#include <cstddef>
#include <optional>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../optimizer.hpp"
#include "../rules/rule_name.hpp"
#include "../state/param_state.hpp"
#include "format.hpp"

namespace skewadam::detail::ckpt {

/// Writes records: header, payload, CRC-32C trailer.
template <class Sink>
class RecordWriter {
 public:
  explicit RecordWriter(Sink& sink) : sink_(sink) {}

  void begin(std::uint32_t tag, std::uint64_t length) {
    unsigned char h[record_header_size];
    put_le(h, tag, 4);
    put_le(h + 4, 0, 4);
    put_le(h + 8, length, 8);
    crc_ = crc32c(h, sizeof h);
    left_ = length;
    sink_.write(h, sizeof h);
  }
  void bytes(const void* p, std::size_t n) {
    if (n > left_) throw std::logic_error("checkpoint writer: record longer than declared");
    crc_ = crc32c_update(crc_, p, n);
    sink_.write(p, n);
    left_ -= n;
  }
  /// count elements of elem bytes each, as little-endian.
  void elements(const void* p, std::size_t count, std::size_t elem) {
    const auto* b = static_cast<const unsigned char*>(p);
    const std::size_t per_chunk = chunk_bytes / elem;
    if constexpr (std::endian::native == std::endian::little) {
      for (std::size_t i = 0; i < count; i += per_chunk) bytes(b + i * elem, std::min(per_chunk, count - i) * elem);
    } else {
      std::vector<unsigned char> buf(chunk_bytes);
      for (std::size_t i = 0; i < count; i += per_chunk) {
        const std::size_t n = std::min(per_chunk, count - i);
        std::memcpy(buf.data(), b + i * elem, n * elem);
        swap_elements(buf.data(), n, elem);
        bytes(buf.data(), n * elem);
      }
    }
  }
  void end() {
    if (left_ != 0) throw std::logic_error("checkpoint writer: record shorter than declared");
    unsigned char t[record_trailer_size];
    put_le(t, crc_, 4);
    sink_.write(t, sizeof t);
  }
  void record(std::uint32_t tag, const std::vector<unsigned char>& payload) {
    begin(tag, payload.size());
    bytes(payload.data(), payload.size());
    end();
  }

 private:
  Sink& sink_;
  std::uint32_t crc_ = 0;
  std::uint64_t left_ = 0;
};

/// A sink that drops everything (the ranks that take part in a sharded save
/// without writing).
class NullSink {
 public:
  void write(const void*, std::size_t) noexcept {}
};

/// Passes writes on until one fails, then drops the rest: a sharded save
/// keeps taking part in the collective gathers after rank 0's file failed,
/// and reports the failure at the end.
template <class Sink>
class GuardedSink {
 public:
  explicit GuardedSink(Sink* sink) : sink_(sink) {}
  void write(const void* p, std::size_t n) {
    if (sink_ == nullptr || !failure_.empty()) return;
    try {
      sink_->write(p, n);
    } catch (const std::exception& e) {
      failure_ = e.what();
      if (failure_.empty()) failure_ = "writing failed";
    }
  }
  const std::string& failure() const noexcept { return failure_; }
  void fail(std::string what) {
    if (failure_.empty()) failure_ = std::move(what);
  }

 private:
  Sink* sink_;
  std::string failure_;
};

inline ParamStateView arrays_of(const ParamStateView& s) noexcept { return s; }
inline ParamStateView arrays_of(const ParamState& s) noexcept { return {s.m, s.v, s.v_row, s.v_col, s.step}; }

// ------------------------------------------------------------------ saving
/// Streams `opt`'s state into `sink`: `fetch(id)` gives parameter id's
/// complete state arrays (a ParamStateView, or a ParamState it owns), one
/// parameter at a time.
template <class Backend, class Placement, class Sink, class Fetch>
void save_with(const OptimizerBase<Backend, Placement>& opt, Sink& sink, const SaveOptions& options,
               Fetch&& fetch) {
  opt.check_no_open_step("save_checkpoint");
  CheckpointInfo info;
  info.steps = opt.steps();
  info.seed = opt.seed();
  info.previous_grad_norm = opt.previous_grad_norm();
  for (Tier t : all_tiers) {
    auto& ti = info.tiers[static_cast<std::size_t>(tier_index(t))];
    ti.name = std::string(tier_name(t));
    ti.rule = opt.tier_facts(t).rule;
    ti.layout = opt.tier_facts(t).layout;
    ti.hyperparameters = opt.hyperparameters(t);
  }
  info.metadata = options.metadata;
  const auto n = static_cast<std::size_t>(opt.size());
  const std::vector<unsigned char> optimizer = encode_optimizer(info, n);
  if (optimizer.size() > max_small_record) throw std::invalid_argument("save_checkpoint: metadata too large");

  std::vector<std::vector<unsigned char>> records(n);
  std::uint64_t total = header_size + record_header_size + optimizer.size() + record_trailer_size;
  for (std::size_t i = 0; i < n; ++i) {
    const ParamId id{static_cast<index_t>(i)};
    const ParamView& pv = opt.param(id);
    CheckpointInfo::Param p;
    p.name = opt.name(id);
    p.tier = opt.tier(id);
    p.dtype = pv.dtype;
    p.shape = pv.shape;
    p.step = opt.step_count(id);
    p.rounding_stream = opt.rounding_stream(id);
    p.arrays = state_arrays(opt.tier_facts(p.tier).layout, p.shape);
    if (options.include_params) p.arrays.push_back({std::string(values_array), p.dtype, p.shape});
    records[i] = encode_param(p);
    if (records[i].size() > max_small_record)
      throw std::invalid_argument("save_checkpoint: the name of parameter #" + std::to_string(i) + " is too long");
    total += record_header_size + records[i].size() + record_trailer_size;
    for (const auto& a : p.arrays)
      total += record_header_size + static_cast<std::uint64_t>(a.shape.numel() * dtype_size(a.dtype)) +
               record_trailer_size;
  }
  total += record_header_size + 8 + record_trailer_size;

  unsigned char h[header_size] = {};
  std::copy(magic.begin(), magic.end(), h);
  put_le(h + 12, format_version, 4);
  put_le(h + 16, total, 8);
  put_le(h + 24, options.include_params ? flag_param_values : 0u, 4);
  put_le(h + 28, crc32c(h, 28), 4);
  sink.write(h, sizeof h);

  RecordWriter<Sink> w(sink);
  w.record(tag_optimizer, optimizer);
  for (std::size_t i = 0; i < n; ++i) {
    const ParamId id{static_cast<index_t>(i)};
    w.record(tag_param, records[i]);
    fetch(id, [&](const ParamStateView& s) {
      for (const auto& a : state_arrays(opt.tier_facts(opt.tier(id)).layout, opt.param(id).shape)) {
        const std::span<const float> data =
            a.name == "m" ? s.m : a.name == "v" ? s.v : a.name == "v_row" ? s.v_row : s.v_col;
        if (static_cast<index_t>(data.size()) != a.shape.numel())
          throw std::logic_error("save_checkpoint: state array " + a.name + " of '" + opt.name(id) +
                                 "' has an unexpected size");
        w.begin(tag_data, data.size() * 4);
        w.elements(data.data(), data.size(), 4);
        w.end();
      }
    });
    if (options.include_params) {
      const ParamView& pv = opt.param(id);
      const auto count = static_cast<std::size_t>(pv.numel());
      const auto elem = static_cast<std::size_t>(dtype_size(pv.dtype));
      opt.engine().with_complete_param(static_cast<std::size_t>(id.index), pv, [&](const std::byte* bytes) {
        w.begin(tag_data, count * elem);
        w.elements(bytes, count, elem);
        w.end();
      });
    }
  }
  Encoder end;
  end.u64(n);
  w.record(tag_end, end.bytes());
}

/// Saves `opt` (collective when sharded: every rank takes part, rank 0
/// writes): each parameter's complete state is fetched in turn (gathered from
/// its owners when sharded), so no process holds more than one complete
/// tensor's state besides its own. A failure on rank 0 is raised as
/// CheckpointError on every rank, after the gathers.
template <class Sink, class Backend, class Placement, class Open, class Commit>
void save(const OptimizerBase<Backend, Placement>& opt, const SaveOptions& options, Open&& open, Commit&& commit) {
  const auto fetch = [&](ParamId id, auto&& f) {
    opt.engine().with_complete_arrays(static_cast<std::size_t>(id.index), f);
  };
  std::string failure;
  if (opt.engine().placement().rank() == 0) {
    std::optional<Sink> target;
    GuardedSink<Sink> sink(nullptr);
    try {
      open(target);
      sink = GuardedSink<Sink>(&*target);
    } catch (const std::exception& e) {
      sink.fail(e.what());
    }
    save_with(opt, sink, options, fetch);
    failure = sink.failure();
    if (failure.empty()) {
      try {
        commit(*target);
      } catch (const std::exception& e) {
        failure = e.what();
        if (failure.empty()) failure = "saving failed";
      }
    }
  } else {
    NullSink sink;
    save_with(opt, sink, options, fetch);
  }
  opt.engine().placement().agree_on_failure(failure);
  if (!failure.empty())
    throw CheckpointError(CheckpointError::Kind::io, (Placement::sharded ? "rank 0: " : "") + failure);
}

}  // namespace skewadam::detail::ckpt
