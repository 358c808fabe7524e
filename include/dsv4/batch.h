// BatchPlan: one forward step's requests in kernel order (decodes first, then prefill chunks),
// and the per-token metadata every op of the layer needs.
//
// A request contributes `num_new` tokens at positions [context, context + num_new), where
// `context` is how many of its tokens earlier steps already cached. A decode is a request with
// exactly one new token and context > 0; everything else is a prefill chunk (possibly continuing
// an earlier chunk: chunked prefill).
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/tensor.h"

namespace dsv4 {

struct RequestStep {
  int64_t req_id = 0;
  int64_t context = 0;  // tokens already cached
  int64_t num_new = 0;  // tokens in this step (>= 1)
  bool is_decode() const { return num_new == 1 && context > 0; }
};

struct BatchPlan {
  // Requests of at most this many new tokens that continue a context (decodes, MTP / speculative
  // steps) are "decode-like": when they lead the plan, their tokens attend one by one through the
  // decode kernel, as FlashMLA's decode takes s_q > 1, instead of a chunk at a time.
  static constexpr int64_t kMaxDecodeLikeTokens = 8;

  std::vector<RequestStep> requests;    // decodes first, then prefills
  int num_decodes = 0;                  // requests [0, num_decodes) are decodes
  // Requests [0, num_decode_like) are decode-like (see above): the decodes, then any further
  // leading requests with context > 0 and at most kMaxDecodeLikeTokens new tokens.
  int num_decode_like = 0;
  std::vector<int32_t> query_start_loc; // [R + 1] token offsets
  std::vector<int64_t> positions;       // [T] absolute positions
  std::vector<int32_t> token_to_req;    // [T] index into `requests`

  int64_t num_tokens() const { return static_cast<int64_t>(positions.size()); }
  int64_t num_decode_tokens() const { return num_decodes; }
  // Tokens of the decode-like requests: rows [0, num_decode_like_tokens()) of the step.
  int64_t num_decode_like_tokens() const { return query_start_loc.empty() ? 0 : query_start_loc[num_decode_like]; }
  int num_requests() const { return static_cast<int>(requests.size()); }
  int64_t seq_len(int r) const { return requests[r].context + requests[r].num_new; }

  // Orders `steps` (stable: decodes first in given order, then prefills in given order) and
  // fills the per-token metadata. Throws dsv4::Error for num_new < 1, context < 0,
  // context + num_new beyond int64, a request id that appears twice, or more than INT32_MAX
  // tokens in all — before allocating anything.
  static BatchPlan make(std::vector<RequestStep> steps);
  // make()'s checks alone: the number of tokens the plan of `steps` would hold (callers compare
  // it with their activations before a plan of that size is built).
  static int64_t count_tokens(const std::vector<RequestStep>& steps);
  // The order make() puts `steps` in, as indices into `steps` (no checks, no per-token data).
  static std::vector<int> kernel_order(const std::vector<RequestStep>& steps);
};

}  // namespace dsv4
