// A serving engine's side of AttentionOptions::caller_caches, for the tests (tests/cpu/
// test_layer_caller_caches.cpp, tests/cuda/test_layer_caller_caches_cuda.cpp): it owns the cache
// tensors of one layer laid out unlike the layer's own (a padded block stride, blocks handed out
// in a scrambled order) and builds each step's CallerStep (vLLM's metadata) from RequestSteps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "dsv4/batch.h"
#include "dsv4/caller_step.h"
#include "dsv4/config.h"
#include "dsv4/device_tensor.h"
#include "dsv4/paged_cache.h"
#include "dsv4/tensor.h"

namespace dsv4_test {

class CallerCacheSim {
 public:
  // `pad_bytes` (a multiple of 16) is added to every KV / key cache block's stride; the rings
  // stay dense (the layer reads them as fp32 rows). Storage bytes start as `poison`, so an entry
  // read before it was written shows.
  CallerCacheSim(const dsv4::ModelConfig& cfg, int layer, const dsv4::LayerCacheOptions& opts,
                 int32_t num_blocks, int64_t pad_bytes, dsv4::Device device, uint8_t poison = 0xFF)
      : cfg_(cfg), device_(device) {
    const dsv4::LayerKind kind = cfg.layer_kind(layer);
    ratio_ = kind == dsv4::LayerKind::swa ? 0 : cfg.compress_ratio(layer);
    dsv4::LayerCacheOptions spec_opts = opts;  // the layer's own caches, for their geometry only
    spec_opts.swa_blocks = spec_opts.compressed_blocks = spec_opts.state_blocks = 1;
    spec_opts.device = dsv4::Device::cpu;
    const dsv4::LayerCaches specs = dsv4::make_layer_caches(cfg, kind, spec_opts);
    const dsv4::PagedCache* all[] = {specs.swa.get(), specs.compressed.get(),
                                     specs.compressor_state.get(), specs.indexer_keys.get(),
                                     specs.indexer_state.get()};
    std::mt19937 rng(1234);
    for (int role = 0; role < 5; ++role) {
      if (!all[role]) continue;
      Cache& c = caches_[role];
      c.present = true;
      c.block_size = all[role]->spec().block_size;
      c.block_bytes = all[role]->spec().block_bytes;
      const bool ring = role == 2 || role == 4;
      c.stride = c.block_bytes + (ring ? 0 : pad_bytes);
      c.num_blocks = num_blocks;
      dsv4::HostTensor host(dsv4::DType::uint8, {int64_t{num_blocks} * c.stride});
      host.fill_bytes(poison);
      if (device == dsv4::Device::cuda)
        c.device_storage = dsv4::DeviceTensor::from_host(host);
      else
        c.host_storage = host;
      for (int32_t b = 0; b < num_blocks; ++b) c.free.push_back(b);
      std::shuffle(c.free.begin(), c.free.end(), rng);
    }
  }

  dsv4::CallerCaches caches() const {
    dsv4::CallerCaches out;
    dsv4::TensorView* fields[] = {&out.swa, &out.compressed, &out.compressor_state,
                                  &out.indexer_keys, &out.indexer_state};
    for (int role = 0; role < 5; ++role)
      if (caches_[role].present) *fields[role] = view(role);
    return out;
  }
  // The bytes of every cache (to see that a refused step wrote nothing).
  std::vector<uint8_t> snapshot() const {
    std::vector<uint8_t> bytes;
    for (const Cache& c : caches_) {
      if (!c.present) continue;
      const dsv4::HostTensor h =
          device_ == dsv4::Device::cuda ? c.device_storage.to_host() : c.host_storage;
      bytes.insert(bytes.end(), h.data<uint8_t>(), h.data<uint8_t>() + h.numel());
    }
    return bytes;
  }

  // The host arrays of one step (kept alive by the holder) and the CallerStep over them.
  struct Step {
    dsv4::HostTensor qsl, seq_lens, positions, slots, tables[5];
    dsv4::CallerStep view;
  };
  // `steps` in kernel order (decodes first). Blocks each request needs are assigned from the
  // scrambled free lists; SWA blocks older than the window are left as garbage ids (the layer
  // must not read them) and every table has two garbage columns past the blocks in use.
  Step step(const std::vector<dsv4::RequestStep>& steps) {
    const int64_t R = static_cast<int64_t>(steps.size());
    int64_t T = 0;
    for (const dsv4::RequestStep& s : steps) T += s.num_new;
    Step out;
    out.qsl = dsv4::HostTensor(dsv4::DType::int32, {R + 1});
    out.seq_lens = dsv4::HostTensor(dsv4::DType::int32, {R});
    out.positions = dsv4::HostTensor(dsv4::DType::int64, {T});
    out.slots = dsv4::HostTensor(dsv4::DType::int64, {T});
    out.qsl.data<int32_t>()[0] = 0;
    for (int64_t r = 0; r < R; ++r) {
      const dsv4::RequestStep& s = steps[r];
      out.qsl.data<int32_t>()[r + 1] = static_cast<int32_t>(out.qsl.data<int32_t>()[r] + s.num_new);
      out.seq_lens.data<int32_t>()[r] = static_cast<int32_t>(s.context + s.num_new);
      for (int role = 0; role < 5; ++role)
        if (caches_[role].present) grow(role, s.req_id, blocks_needed(role, s.context + s.num_new));
    }
    for (int role = 0; role < 5; ++role) {
      if (!caches_[role].present) continue;
      size_t width = 0;
      for (const dsv4::RequestStep& s : steps) width = std::max(width, table(role, s.req_id).size());
      width += 2;
      dsv4::HostTensor& t = out.tables[role];
      t = dsv4::HostTensor(dsv4::DType::int32, {R, static_cast<int64_t>(width)});
      std::fill(t.data<int32_t>(), t.data<int32_t>() + t.numel(), kGarbage);
      for (int64_t r = 0; r < R; ++r) {
        const std::vector<int32_t>& tab = table(role, steps[r].req_id);
        std::copy(tab.begin(), tab.end(), t.data<int32_t>() + r * static_cast<int64_t>(width));
        if (role == 0) {  // SWA blocks wholly before the window of the step's first token
          const int64_t W = cfg_.window_size, B = caches_[0].block_size;
          const int64_t old = steps[r].context > W ? (steps[r].context - W) / B : 0;
          std::fill(t.data<int32_t>() + r * static_cast<int64_t>(width),
                    t.data<int32_t>() + r * static_cast<int64_t>(width) + old, kGarbage);
        }
      }
    }
    int64_t tok = 0;
    for (const dsv4::RequestStep& s : steps)
      for (int64_t i = 0; i < s.num_new; ++i, ++tok) {
        const int64_t pos = s.context + i, B = caches_[0].block_size;
        out.positions.data<int64_t>()[tok] = pos;
        out.slots.data<int64_t>()[tok] = int64_t{table(0, s.req_id)[pos / B]} * B + pos % B;
      }
    out.view.query_start_loc = out.qsl;
    out.view.seq_lens = out.seq_lens;
    out.view.positions = out.positions;
    out.view.slot_mapping = out.slots;
    dsv4::TensorView* fields[] = {&out.view.swa_block_table, &out.view.compressed_block_table,
                                  &out.view.compressor_state_block_table,
                                  &out.view.indexer_keys_block_table,
                                  &out.view.indexer_state_block_table};
    for (int role = 0; role < 5; ++role)
      if (caches_[role].present) *fields[role] = out.tables[role];
    return out;
  }

  static constexpr int32_t kGarbage = 1 << 30;

 private:
  struct Cache {
    bool present = false;
    int block_size = 0;
    int64_t block_bytes = 0, stride = 0;
    int32_t num_blocks = 0;
    dsv4::HostTensor host_storage;
    dsv4::DeviceTensor device_storage;
    std::vector<int32_t> free;
    std::map<int64_t, std::vector<int32_t>> tables;
  };
  dsv4::TensorView view(int role) const {
    const Cache& c = caches_[role];
    void* data = device_ == dsv4::Device::cuda ? c.device_storage.data<void>() : c.host_storage.data<void>();
    dsv4::TensorView v(data, dsv4::DType::uint8, {int64_t{c.num_blocks}, c.block_bytes}, device_);
    v.strides[0] = c.stride;
    return v;
  }
  int64_t blocks_needed(int role, int64_t seq_len) const {
    const int64_t B = caches_[role].block_size;
    const int64_t entries = role == 0 ? seq_len
                            : role == 1 || role == 3 ? seq_len / ratio_
                            : role == 2 ? (ratio_ == 4 ? 2 : 1) * ratio_
                                        : 8;  // the indexer's ratio-4 ring
    return (entries + B - 1) / B;
  }
  std::vector<int32_t>& table(int role, int64_t req) { return caches_[role].tables[req]; }
  void grow(int role, int64_t req, int64_t blocks) {
    Cache& c = caches_[role];
    std::vector<int32_t>& t = c.tables[req];
    while (static_cast<int64_t>(t.size()) < blocks) {
      t.push_back(c.free.back());
      c.free.pop_back();
    }
  }

  dsv4::ModelConfig cfg_;
  dsv4::Device device_;
  int ratio_ = 0;
  Cache caches_[5];
};

}  // namespace dsv4_test
