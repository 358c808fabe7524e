#include "dsv4/batch.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/checked_math.h"
#include "dsv4/status.h"

namespace dsv4 {

int64_t BatchPlan::count_tokens(const std::vector<RequestStep>& steps) {
  constexpr const char* kWhere = "BatchPlan";
  // Called for every step on the decode path: no allocation per request unless one is refused.
  auto req = [](const RequestStep& s) { return "request " + std::to_string(s.req_id); };
  int64_t tokens = 0;
  for (const RequestStep& s : steps) {
    if (s.num_new < 1) fail_expected(kWhere, "num_new of " + req(s), ">= 1", s.num_new);
    if (s.context < 0) fail_expected(kWhere, "context of " + req(s), ">= 0", s.context);
    if (!add_i64(s.context, s.num_new))
      fail(kWhere, ": context + num_new of ", req(s), ": ", s.context, " + ", s.num_new,
           " overflows int64");
    // query_start_loc is int32: the step's tokens must fit it.
    const auto sum = add_i64(tokens, s.num_new);
    if (!sum || *sum > INT32_MAX)
      fail(kWhere, ": tokens of one step: expected <= ", INT32_MAX, " (int32 offsets), got more at ",
           req(s), " (num_new ", s.num_new, ")");
    tokens = *sum;
  }
  // Each request once: sorted ids (one allocation, not a node per request).
  std::vector<int64_t> ids(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) ids[i] = steps[i].req_id;
  std::sort(ids.begin(), ids.end());
  const auto twice = std::adjacent_find(ids.begin(), ids.end());
  if (twice != ids.end()) fail(kWhere, ": request ", *twice, " appears twice in one step");
  return tokens;
}

std::vector<int> BatchPlan::kernel_order(const std::vector<RequestStep>& steps) {
  std::vector<int> order(steps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_partition(order.begin(), order.end(), [&](int i) { return steps[i].is_decode(); });
  return order;
}

BatchPlan BatchPlan::make(std::vector<RequestStep> steps) {
  const int64_t tokens = count_tokens(steps);
  BatchPlan plan;
  for (int i : kernel_order(steps)) plan.requests.push_back(steps[i]);
  plan.num_decodes = static_cast<int>(std::count_if(plan.requests.begin(), plan.requests.end(),
                                                    [](const RequestStep& s) { return s.is_decode(); }));
  while (plan.num_decode_like < plan.num_requests()) {
    const RequestStep& s = plan.requests[plan.num_decode_like];
    if (s.context == 0 || s.num_new > kMaxDecodeLikeTokens) break;
    ++plan.num_decode_like;
  }
  plan.positions.reserve(static_cast<size_t>(tokens));
  plan.token_to_req.reserve(static_cast<size_t>(tokens));
  plan.query_start_loc.push_back(0);
  for (int r = 0; r < plan.num_requests(); ++r) {
    const RequestStep& s = plan.requests[r];
    for (int64_t i = 0; i < s.num_new; ++i) {
      plan.positions.push_back(s.context + i);
      plan.token_to_req.push_back(r);
    }
    plan.query_start_loc.push_back(static_cast<int32_t>(plan.positions.size()));
  }
  return plan;
}

}  // namespace dsv4
