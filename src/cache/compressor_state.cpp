// The compressor rings' PagedCache bookkeeping (include/dsv4/compressor.h): reserving a
// request's ring and viewing the cache's storage as fp32 state rows.
#include "dsv4/compressor.h"

namespace dsv4 {

namespace {
void check_state_cache(const char* where, const PagedCache& state, const CompressorConfig& cfg) {
  const int64_t row_bytes = int64_t{cfg.state_width()} * 4;
  const int64_t want = int64_t{state.spec().block_size} * row_bytes;
  if (state.spec().block_bytes != want)
    fail_expected(where, "state.spec().block_bytes",
                  detail::concat(want, " (block_size x ", row_bytes, " B fp32 rows)"),
                  state.spec().block_bytes);
}
}  // namespace

void compressor_state_init(PagedCache& state, const CompressorConfig& cfg, int64_t req) {
  constexpr const char* kOp = "compressor_state_init";
  cfg.validate(kOp);
  check_state_cache(kOp, state, cfg);
  const bool registered = state.has_request(req);
  if (registered && state.num_entries(req) != 0)
    fail_expected(kOp, detail::concat("rows of request ", req), "0 (a ring is reserved once)",
                  state.num_entries(req));
  if (!registered) state.add_request(req);
  try {
    state.append(req, cfg.ring_rows());
  } catch (...) {
    if (!registered) state.remove_request(req);  // atomic: a full pool leaves the cache as it was
    throw;
  }
}

TensorView compressor_state_rows(const PagedCache& state, const CompressorConfig& cfg) {
  constexpr const char* kOp = "compressor_state_rows";
  cfg.validate(kOp);
  check_state_cache(kOp, state, cfg);
  return TensorView(
      state.storage(), DType::fp32,
      {int64_t{state.spec().num_blocks} * state.spec().block_size, int64_t{cfg.state_width()}},
      state.device());
}

}  // namespace dsv4
