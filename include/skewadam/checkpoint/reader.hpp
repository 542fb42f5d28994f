#pragma once
// Reading a checkpoint: the header and records with every checksum checked,
// walk() over its structure, and load(), which checks everything against an
// optimizer's registered parameters before it swaps the state in.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../optimizer.hpp"
#include "../rules/rule_name.hpp"
#include "../state/optimizer_state.hpp"
#include "format.hpp"

namespace skewadam::detail::ckpt {

// ----------------------------------------------------------------- records
template <class Source>
std::string at_byte(const Source& src) {
  return "at byte " + std::to_string(src.position());
}

struct Header {
  std::uint32_t version = 0;
  std::uint64_t file_size = 0;
  std::uint32_t flags = 0;
};

template <class Source>
Header read_header(Source& src) {
  const std::string& where = src.where();
  unsigned char h[header_size] = {};
  if (src.size() < magic.size()) {
    if (src.size() == 0) throw CheckpointError(CheckpointError::Kind::not_a_checkpoint, where + ": empty file, not a checkpoint");
    throw CheckpointError(CheckpointError::Kind::not_a_checkpoint,
                          where + ": not a skewadam checkpoint (too short for its signature)");
  }
  src.read(h, magic.size());
  if (!std::equal(magic.begin(), magic.end(), h))
    throw CheckpointError(CheckpointError::Kind::not_a_checkpoint,
                          where + ": not a skewadam checkpoint (unknown signature)");
  if (src.size() < header_size) throw corrupt(where, "truncated inside the file header");
  src.read(h + magic.size(), header_size - magic.size());
  if (crc32c(h, 28) != static_cast<std::uint32_t>(get_le(h + 28, 4)))
    throw corrupt(where, "file header checksum mismatch");
  Header r;
  r.version = static_cast<std::uint32_t>(get_le(h + 12, 4));
  r.file_size = get_le(h + 16, 8);
  r.flags = static_cast<std::uint32_t>(get_le(h + 24, 4));
  if (r.version < oldest_format_version || r.version > format_version)
    throw CheckpointError(CheckpointError::Kind::unsupported_version,
                          where + ": checkpoint format version " + std::to_string(r.version) +
                              "; this build reads versions " + std::to_string(oldest_format_version) + " to " +
                              std::to_string(format_version));
  if (r.file_size != src.size()) {
    if (src.size() < r.file_size)
      throw corrupt(where, "truncated: " + std::to_string(src.size()) + " bytes, the header says " +
                               std::to_string(r.file_size));
    throw corrupt(where, bytes_text(src.size() - r.file_size) + " after the end (" +
                             std::to_string(src.size()) + " bytes, the header says " + std::to_string(r.file_size) + ")");
  }
  if (r.flags & ~known_flags) throw corrupt(where, "unknown header flags " + std::to_string(r.flags));
  return r;
}

struct RecordHead {
  std::uint64_t at = 0;      ///< offset of the record
  std::uint64_t length = 0;  ///< payload bytes
  std::uint32_t crc = 0;     ///< CRC-32C of the record header
};

template <class Source>
RecordHead read_record_head(Source& src, std::uint32_t tag, const std::string& what) {
  RecordHead r;
  r.at = src.position();
  if (src.size() - src.position() < record_header_size + record_trailer_size)
    throw corrupt(src.where(), "truncated: no room for the " + what + " record " + at_byte(src));
  unsigned char h[record_header_size];
  src.read(h, sizeof h);
  const auto got = static_cast<std::uint32_t>(get_le(h, 4));
  if (got != tag)
    throw corrupt(src.where(), "expected the " + what + " record (" + tag_text(tag) + ") at byte " +
                                   std::to_string(r.at) + ", found " + tag_text(got));
  if (get_le(h + 4, 4) != 0) throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " has a non-zero reserved field");
  r.length = get_le(h + 8, 8);
  if (r.length > src.size() - src.position() - record_trailer_size)
    throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " claims " +
                                   std::to_string(r.length) + " bytes, more than the file holds (truncated?)");
  r.crc = crc32c(h, sizeof h);
  return r;
}

template <class Source>
void check_trailer(Source& src, const RecordHead& r, std::uint32_t crc, const std::string& what) {
  unsigned char t[record_trailer_size];
  src.read(t, sizeof t);
  if (static_cast<std::uint32_t>(get_le(t, 4)) != crc)
    throw corrupt(src.where(), "checksum mismatch in the " + what + " record at byte " + std::to_string(r.at));
}

template <class Source>
std::vector<unsigned char> read_small_record(Source& src, std::uint32_t tag, const std::string& what) {
  const RecordHead r = read_record_head(src, tag, what);
  if (r.length > max_small_record)
    throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " claims " +
                                   std::to_string(r.length) + " bytes (at most " + std::to_string(max_small_record) + ")");
  std::vector<unsigned char> payload(static_cast<std::size_t>(r.length));
  src.read(payload.data(), r.length);
  check_trailer(src, r, crc32c_update(r.crc, payload.data(), payload.size()), what);
  return payload;
}

/// Reads a DATA record of exactly `bytes` bytes into dst (count elements of
/// elem bytes each); on a null dst skips it without reading.
template <class Source>
void read_data_record(Source& src, void* dst, std::uint64_t count, std::size_t elem, const std::string& what) {
  const RecordHead r = read_record_head(src, tag_data, what);
  if (count > std::numeric_limits<std::uint64_t>::max() / elem || r.length != count * elem)
    throw corrupt(src.where(), "the " + what + " record at byte " + std::to_string(r.at) + " holds " +
                                   std::to_string(r.length) + " bytes, its shape needs " +
                                   std::to_string(count) + " x " + std::to_string(elem));
  if (!dst) {
    src.skip(r.length + record_trailer_size);
    return;
  }
  auto* d = static_cast<unsigned char*>(dst);
  std::uint32_t crc = r.crc;
  for (std::uint64_t done = 0; done < r.length;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, r.length - done));
    src.read(d + done, n);
    crc = crc32c_update(crc, d + done, n);
    done += n;
  }
  check_trailer(src, r, crc, what);
  if constexpr (std::endian::native != std::endian::little)
    swap_elements(d, static_cast<std::size_t>(count), elem);
}

/// Walks a checkpoint: header, optimizer record, every parameter record and
/// its arrays, end record. `on_optimizer(info)` sees the header and optimizer
/// record; `on_param(param)` returns, per array, where to read it (null:
/// skip); `on_arrays(param)` is called once they have been read. Every
/// structural problem throws CheckpointError.
template <class Source, class OnOptimizer, class OnParam, class OnArrays>
void walk(Source& src, CheckpointInfo& info, OnOptimizer&& on_optimizer, OnParam&& on_param, OnArrays&& on_arrays) {
  const std::string& where = src.where();
  const Header h = read_header(src);
  info.format_version = h.version;
  info.file_size = h.file_size;
  info.has_param_values = (h.flags & flag_param_values) != 0;
  const std::uint64_t nparams =
      decode_optimizer(read_small_record(src, tag_optimizer, "optimizer"), where, h.version, info);
  on_optimizer(static_cast<const CheckpointInfo&>(info));
  for (std::uint64_t k = 0; k < nparams; ++k) {
    const std::string what = "parameter #" + std::to_string(k);
    CheckpointInfo::Param p = decode_param(read_small_record(src, tag_param, what), where + ": " + what,
                                           info.steps, info.has_param_values);
    const std::vector<void*> dst = on_param(static_cast<const CheckpointInfo::Param&>(p));
    for (std::size_t i = 0; i < p.arrays.size(); ++i) {
      const auto& a = p.arrays[i];
      read_data_record(src, i < dst.size() ? dst[i] : nullptr, static_cast<std::uint64_t>(a.shape.numel()),
                       static_cast<std::size_t>(dtype_size(a.dtype)), "'" + p.name + "' " + a.name + " data");
    }
    on_arrays(static_cast<const CheckpointInfo::Param&>(p));
    info.params.push_back(std::move(p));
  }
  const std::vector<unsigned char> end = read_small_record(src, tag_end, "end");
  Decoder d(end, where + ": end record");
  const std::uint64_t count = d.u64();
  d.finish();
  if (count != nparams)
    throw corrupt(where, "the end record counts " + std::to_string(count) + " parameters, the optimizer record " +
                             std::to_string(nparams));
  if (src.position() != src.size()) throw corrupt(where, "unexpected bytes after the end record");
}

template <class Source, class OnOptimizer, class OnParam>
void walk(Source& src, CheckpointInfo& info, OnOptimizer&& on_optimizer, OnParam&& on_param) {
  walk(src, info, on_optimizer, on_param, [](const CheckpointInfo::Param&) {});
}

// ----------------------------------------------------------------- loading
/// Loads a checkpoint into an optimizer of any placement: each parameter's
/// arrays are read and handed to the optimizer's import as they come
/// (Optimizer::import_param), so that a sharded optimizer keeps only its share
/// and never holds more than one complete tensor besides.
template <class Backend, class Placement, class Source>
void load(OptimizerBase<Backend, Placement>& opt, Source& src, const LoadOptions& options) {
  using Opt = OptimizerBase<Backend, Placement>;
  const std::string& where = src.where();
  const auto n = static_cast<std::size_t>(opt.size());
  std::vector<std::string> problems;
  std::array<Hyperparameters, tier_count> hyper{};
  std::vector<char> found(n, 0);
  std::vector<std::vector<unsigned char>> values;
  bool load_values = false;
  std::array<bool, tier_count> rule_ok{};
  typename Opt::StateImport import = opt.begin_import();
  // the parameter being read, if its state is to be taken
  std::optional<ParamId> current;
  ParamState state;

  auto take = [&](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      throw corrupt(where, e.what());
    }
  };

  CheckpointInfo info;
  walk(
      src, info,
      [&](const CheckpointInfo& c) {
        if (!c.has_param_values && options.params == ParamValues::require)
          throw CheckpointError(CheckpointError::Kind::mismatch,
                                where + ": holds no parameter values (it was saved without include_params)");
        load_values = c.has_param_values && options.params != ParamValues::ignore;
        if (load_values) values.resize(n);
        for (Tier t : all_tiers) {
          const auto i = static_cast<std::size_t>(tier_index(t));
          const std::string mine = opt.tier_facts(t).rule;
          rule_ok[i] = same_saved_rule(c.tiers[i].rule, mine) && c.tiers[i].layout == opt.tier_facts(t).layout;
          if (!rule_ok[i])
            problems.push_back("tier " + c.tiers[i].name + ": rule " + c.tiers[i].rule +
                               " in the checkpoint, " + mine + " in this optimizer");
          hyper[i] = c.tiers[i].hyperparameters;
        }
      },
      [&](const CheckpointInfo::Param& p) -> std::vector<void*> {
        std::vector<void*> dst;
        current.reset();
        const std::optional<ParamId> id = opt.find(p.name);
        if (!id) {
          problems.push_back("'" + p.name + "': in the checkpoint, not registered");
          return dst;
        }
        const auto i = static_cast<std::size_t>(id->index);
        if (found[i]) throw corrupt(where, "parameter '" + p.name + "' appears twice");
        found[i] = 1;
        const ParamView& pv = opt.param(*id);
        const Tier tier = opt.tier(*id);
        const std::size_t before = problems.size();
        if (p.tier != tier)
          problems.push_back("'" + p.name + "': tier " + std::string(tier_name(p.tier)) + " in the checkpoint, " +
                             std::string(tier_name(tier)) + " registered");
        if (p.dtype != pv.dtype)
          problems.push_back("'" + p.name + "': dtype " + std::string(dtype_name(p.dtype)) + " in the checkpoint, " +
                             std::string(dtype_name(pv.dtype)) + " registered (nothing is converted)");
        if (!(p.shape == pv.shape))
          problems.push_back("'" + p.name + "': shape " + p.shape.str() + " in the checkpoint, " + pv.shape.str() +
                             " registered");
        if (problems.size() != before || !rule_ok[static_cast<std::size_t>(tier_index(tier))]) return dst;
        const std::vector<CheckpointInfo::Array> want = state_arrays(opt.tier_facts(tier).layout, pv.shape);
        if (!same_arrays(p.arrays, want)) {
          problems.push_back("'" + p.name + "': state arrays " + arrays_text(p.arrays) + " in the checkpoint, " +
                             arrays_text(want) + " kept by this optimizer");
          return dst;
        }
        current = id;
        state = ParamState{};
        state.step = p.step;
        for (const auto& a : p.arrays) {
          if (a.name == values_array) {
            if (!load_values) {
              dst.push_back(nullptr);
              continue;
            }
            values[i].resize(static_cast<std::size_t>(pv.bytes()));
            dst.push_back(values[i].data());
            continue;
          }
          std::vector<float>& v = a.name == "m" ? state.m : a.name == "v" ? state.v : a.name == "v_row" ? state.v_row : state.v_col;
          v.resize(static_cast<std::size_t>(a.shape.numel()));
          dst.push_back(v.data());
        }
        return dst;
      },
      [&](const CheckpointInfo::Param& p) {
        if (!current || !problems.empty()) return;  // a mismatch: nothing will be imported
        take([&] { opt.import_param(import, *current, std::move(state), p.rounding_stream, info.steps); });
        current.reset();
      });

  for (std::size_t i = 0; i < n; ++i)
    if (!found[i]) problems.push_back("'" + opt.name(ParamId{static_cast<index_t>(i)}) + "': registered, not in the checkpoint");
  if (!problems.empty()) {
    constexpr std::size_t shown = 40;
    std::string msg = where + ": does not match the optimizer (" + std::to_string(problems.size()) +
                      (problems.size() == 1 ? " problem" : " problems") + "):";
    for (std::size_t i = 0; i < std::min(shown, problems.size()); ++i) msg += "\n  " + problems[i];
    if (problems.size() > shown) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    throw CheckpointError(CheckpointError::Kind::mismatch, msg);
  }
  take([&] { opt.finish_import(std::move(import), hyper, info.seed, info.steps, info.previous_grad_norm); });
  // sizes were checked against the registered parameters: a host copy cannot
  // fail (a device copy fails only with the device)
  if (load_values)
    for (std::size_t i = 0; i < n; ++i) {
      const ParamView& pv = opt.param(ParamId{static_cast<index_t>(i)});
      if (values[i].empty()) continue;
      opt.engine().memory().write(pv.data, values[i].data(), values[i].size());
    }
}

}  // namespace skewadam::detail::ckpt
