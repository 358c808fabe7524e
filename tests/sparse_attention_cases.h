// Shared set-up of the sparse attention tests (tests/cpu/test_sparse_decode.cpp,
// tests/cpu/test_sparse_prefill.cpp, tests/cuda/test_sparse_attention_cpu_vs_cuda.cpp): random
// decode scopes (a paged cache with its index lists), random lengths and sinks, the decode
// arguments assembled from them, and the expected-error check — so each suite states only its
// cases and checks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu/sparse_attention_reference.h"
#include "dsv4/ops.h"

namespace dsv4::test {

// topk_length values of `rows` rows: the first full, the second 0, the rest uniform in 0..topk.
inline HostTensor random_lengths(int64_t rows, int topk, std::mt19937& rng) {
  HostTensor lengths(DType::int32, {rows});
  for (int64_t i = 0; i < rows; ++i)
    lengths.data<int32_t>()[i] = i == 0 ? topk : i == 1 ? 0 : static_cast<int32_t>(rng() % (topk + 1));
  return lengths;
}

// An attention sink per head, N(mean, 2²).
inline HostTensor random_sink(int heads, std::mt19937& rng, float mean = 0.0f) {
  HostTensor sink(DType::fp32, {heads});
  std::normal_distribution<float> normal(mean, 2.0f);
  for (int i = 0; i < heads; ++i) sink.data<float>()[i] = normal(rng);
  return sink;
}

// What a decode scope's index lists hold besides clean slots (-1 and duplicates always).
struct IndexMix {
  bool all_invalid = false;  // every entry -1
  // Entries past topk_length (never counted): alternately a NaN row's slot and 1 << 30 (a value
  // no cache has); when false, always 1 << 30.
  bool nan_rows_past_length = true;
};

// One decode scope: a cache with ~1/8 of its slots left as NaN bytes, and indices [b, s_q, topk]
// into it (lengths [b] when with_length). block_stride: the cache's (0: its block bytes).
struct DecodeScope {
  std::unique_ptr<TestCache> cache;
  std::vector<int64_t> clean_slots, poisoned_slots;
  HostTensor indices, lengths;  // lengths undefined when not used

  DecodeScope(KvLayout layout, int block_size, int b, int s_q, int topk, bool with_length,
              std::mt19937& rng, IndexMix mix = {}, int64_t block_stride = 0) {
    const int64_t blocks = (4 * int64_t{topk} + block_size - 1) / block_size + 1;
    cache = std::make_unique<TestCache>(layout, block_size, blocks,
                                        layout == KvLayout::fp8_per_tensor ? 0.37f : 1.0f,
                                        block_stride);
    for (int64_t s = 0; s < cache->num_slots(); ++s) {
      if (rng() % 8 == 0) {
        poisoned_slots.push_back(s);
      } else {
        cache->fill_token(s, rng);
        clean_slots.push_back(s);
      }
    }
    if (with_length) lengths = random_lengths(b, topk, rng);
    indices = HostTensor(DType::int32, {b, s_q, topk});
    for (int bi = 0; bi < b; ++bi)
      for (int si = 0; si < s_q; ++si) {
        int32_t* row = indices.data<int32_t>() + (int64_t{bi} * s_q + si) * topk;
        for (int k = 0; k < topk; ++k) {
          if (mix.all_invalid) {
            row[k] = -1;
          } else if (k >= counted(bi)) {  // never counted: not an error
            const bool nan_row = mix.nan_rows_past_length && k % 2 == 1;
            row[k] = nan_row ? static_cast<int32_t>(poisoned_slots[rng() % poisoned_slots.size()])
                             : 1 << 30;
          } else if (rng() % 10 == 0) {
            row[k] = -1;
          } else if (k > 0 && rng() % 10 == 0) {
            row[k] = row[k - 1];  // a duplicate
          } else {
            row[k] = static_cast<int32_t>(clean_slots[rng() % clean_slots.size()]);
          }
        }
      }
  }
  // Entries of batch row bi that count.
  int32_t counted(int bi) const {
    return lengths.view().defined() ? lengths.data<int32_t>()[bi]
                                    : static_cast<int32_t>(indices.shape()[2]);
  }
};

// The decode arguments over one or two scopes (extra may be null); scale 0 = d_qk^-0.5.
inline SparseDecodeArgs decode_args(const TensorView& q, const DecodeScope& main,
                                    const DecodeScope* extra, const TensorView& sink, float scale,
                                    int d_v, const TensorView& out, const TensorView& lse) {
  SparseDecodeArgs a;
  a.q = q;
  a.k_cache = main.cache->view();
  a.indices = main.indices;
  a.topk_length = main.lengths;
  if (extra) {
    a.extra_k_cache = extra->cache->view();
    a.extra_indices = extra->indices;
    a.extra_topk_length = extra->lengths;
  }
  a.attn_sink = sink;
  a.softmax_scale = scale;
  a.d_v = d_v;
  a.out = out;
  a.lse = lse;
  return a;
}

// ---- FlashMLA-style layouts ----------------------------------------------------------------------
// Calls fn(flat, offset) for every element of `v` in row-major order: flat is the element's index
// in a dense tensor of v's shape, offset its element offset from v.data.
template <typename Fn>
void for_each_element(const TensorView& v, Fn&& fn) {
  const int64_t n = v.numel();
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rest = flat, offset = 0;
    for (int d = v.ndim - 1; d >= 0; --d) {
      offset += rest % v.shape[d] * v.strides[d];
      rest /= v.shape[d];
    }
    fn(flat, offset);
  }
}

// A tensor held the way FlashMLA's test generators (non_contiguousify) and serving engines hand
// them over: inside a larger buffer whose every dim is padded by pad[d] elements, the first two
// dims optionally laid out in swapped order (swap01: [b, s_q] that do not merge, a transposed
// view), the last dim contiguous. The buffer's padding holds 0xFF bytes (NaN for floats).
struct StridedTensor {
  HostTensor storage;  // the whole buffer
  TensorView view;     // the tensor, strided, into `storage`

  StridedTensor(DType dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& pad,
                bool swap01) {
    const int n = static_cast<int>(shape.size());
    std::vector<int64_t> padded(n), order(n);
    for (int d = 0; d < n; ++d) {
      padded[d] = shape[d] + pad[d];
      order[d] = d;
    }
    if (swap01 && n >= 3) std::swap(order[0], order[1]);  // storage dim i holds tensor dim order[i]
    std::vector<int64_t> storage_shape(n);
    for (int i = 0; i < n; ++i) storage_shape[i] = padded[order[i]];
    storage = HostTensor(dtype, storage_shape);
    storage.fill_bytes(0xFF);
    view = TensorView(storage.data<void>(), dtype, shape);
    int64_t stride = 1;
    for (int i = n - 1; i >= 0; --i) {
      view.strides[order[i]] = stride;
      stride *= storage_shape[i];
    }
  }
  // A strided copy of `dense` (row-major).
  static StridedTensor copy_of(const HostTensor& dense, const std::vector<int64_t>& pad,
                               bool swap01) {
    StridedTensor t(dense.dtype(), dense.shape(), pad, swap01);
    const size_t esize = dtype_size(dense.dtype());
    for_each_element(t.view, [&](int64_t flat, int64_t offset) {
      std::memcpy(t.storage.data<uint8_t>() + offset * esize,
                  dense.data<uint8_t>() + flat * esize, esize);
    });
    return t;
  }
  // The elements of the view as a dense tensor.
  HostTensor dense() const { return HostTensor::copy_of(view); }
  // A copy of the whole buffer (to compare after an op wrote the view).
  HostTensor snapshot() const { return HostTensor::copy_of(storage.view()); }
  // Every byte of the buffer outside the view is as in `before` (a snapshot).
  void expect_only_view_written(const HostTensor& before) const {
    HostTensor expect = HostTensor::copy_of(before.view());
    const size_t esize = dtype_size(view.dtype);
    for_each_element(view, [&](int64_t, int64_t offset) {
      std::memcpy(expect.data<uint8_t>() + offset * esize, storage.data<uint8_t>() + offset * esize,
                  esize);
    });
    EXPECT_EQ(0, std::memcmp(expect.data<uint8_t>(), storage.data<uint8_t>(), expect.nbytes()))
        << "bytes outside the view changed";
  }
};

// Runs `call` and expects a dsv4::Error whose message contains each of `needles`.
inline void expect_error(const std::function<void()>& call,
                         std::initializer_list<std::string_view> needles) {
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (std::string_view needle : needles)
      EXPECT_NE(std::string_view(e.what()).find(needle), std::string_view::npos) << e.what();
  }
}

}  // namespace dsv4::test
