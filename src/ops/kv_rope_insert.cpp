// kv_rope_insert (include/dsv4/kv_rope_insert.h): qnorm_rope_kv_insert with a query tensor of no
// heads, so both backends run the insert they already share, bit for bit.
#include "dsv4/kv_rope_insert.h"

namespace dsv4 {

void kv_rope_insert(const TensorView& kv, const TensorView& positions, const TensorView& cos_sin,
                    const KvCacheView& cache, const TensorView& slot_mapping, Stream stream) {
  check_ndim("kv_rope_insert", "kv", kv, 2);
  // An empty step may come without memory (what an empty torch tensor hands over): nothing to do.
  if (kv.shape[0] == 0 && kv.data == nullptr) return;
  check_defined("kv_rope_insert", "kv", kv);
  // q [T, 0, D]: no elements, so it aliases nothing and no kernel reads it; kv's address serves.
  // eps is unused without heads.
  const TensorView q(kv.data, DType::bf16, {kv.shape[0], 0, kv.shape[1]}, kv.device);
  qnorm_rope_kv_insert(q, kv, positions, cos_sin, 1e-6f, cache, slot_mapping, stream);
}

}  // namespace dsv4
