#include "dsv4/batch.h"

#include <algorithm>
#include <set>

#include "dsv4/status.h"

namespace dsv4 {

BatchPlan BatchPlan::make(std::vector<RequestStep> steps) {
  std::set<int64_t> seen;
  for (const RequestStep& s : steps) {
    if (s.num_new < 1) fail_expected("BatchPlan", "num_new of request " + std::to_string(s.req_id), ">= 1", s.num_new);
    if (s.context < 0) fail_expected("BatchPlan", "context of request " + std::to_string(s.req_id), ">= 0", s.context);
    if (!seen.insert(s.req_id).second) fail("BatchPlan: request ", s.req_id, " appears twice in one step");
  }
  std::stable_partition(steps.begin(), steps.end(), [](const RequestStep& s) { return s.is_decode(); });
  BatchPlan plan;
  plan.requests = std::move(steps);
  plan.num_decodes = static_cast<int>(std::count_if(plan.requests.begin(), plan.requests.end(),
                                                    [](const RequestStep& s) { return s.is_decode(); }));
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
