#include "scheduler.h"

#include <algorithm>
#include <cmath>

#include "dsv4/status.h"

namespace dsv4::cli {

// What one schedule() call has left to give: free blocks per pool, the watermark admissions
// keep, the token budget, and which requests it already scheduled.
struct Scheduler::StepState {
  const KvCapacity& kv;
  std::vector<int64_t> free, watermark;
  int64_t budget = 0;
  std::vector<int64_t> scheduled;  // ids, this step
  StepSchedule out;

  bool is_scheduled(int64_t id) const {
    return std::find(scheduled.begin(), scheduled.end(), id) != scheduled.end();
  }
};

Scheduler::Scheduler(SchedulerOptions opts) : opts_(opts) {
  if (opts_.token_budget < 1) fail_expected("Scheduler", "token_budget", ">= 1", opts_.token_budget);
  if (opts_.max_running < 0) fail_expected("Scheduler", "max_running", ">= 0 (0: no limit)", opts_.max_running);
  if (!(opts_.watermark >= 0 && opts_.watermark < 1))
    fail_expected("Scheduler", "watermark", "in [0, 1)", opts_.watermark);
}

void Scheduler::add_request(int64_t id, int64_t prompt, int64_t decode_steps) {
  if (prompt < 1) fail_expected("Scheduler::add_request", "prompt", ">= 1", prompt);
  if (decode_steps < 0) fail_expected("Scheduler::add_request", "decode_steps", ">= 0", decode_steps);
  if (index_.count(id)) fail("Scheduler::add_request: request ", id, " was already added");
  Request r;
  r.id = id;
  r.prompt = prompt;
  r.total = prompt + decode_steps;
  r.known = prompt;
  index_[id] = requests_.size();
  requests_.push_back(r);
  waiting_.push_back(id);
}

Scheduler::Request& Scheduler::request(int64_t id) {
  auto it = index_.find(id);
  if (it == index_.end()) fail("Scheduler: unknown request ", id);
  return requests_[it->second];
}

int64_t Scheduler::fit(const StepState& st, const Request& r, int64_t n_max, bool shrink,
                       bool reserve) const {
  auto fits = [&](int64_t n) {
    for (int p = 0; p < st.kv.num_pools(); ++p)
      if (st.kv.step_blocks(p, r.computed, n) > st.free[p] - (reserve ? st.watermark[p] : 0)) return false;
    return true;
  };
  if (n_max < 1) return 0;
  if (fits(n_max)) return n_max;
  if (!shrink || !fits(1)) return 0;
  int64_t lo = 1, hi = n_max;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

void Scheduler::take(StepState& st, const Request& r, int64_t n) {
  for (int p = 0; p < st.kv.num_pools(); ++p) st.free[p] -= st.kv.step_blocks(p, r.computed, n);
  st.budget -= n;
  st.scheduled.push_back(r.id);
  st.out.steps.push_back({r.id, r.computed, n});
}

bool Scheduler::preempt_below(StepState& st, size_t pos) {
  for (size_t i = running_.size(); i-- > pos + 1;) {
    const int64_t id = running_[i];
    if (st.is_scheduled(id)) continue;
    // Nothing of the victim is scheduled this step, so its blocks all come back.
    for (int p = 0; p < st.kv.num_pools(); ++p) st.free[p] += st.kv.held_blocks(p, id);
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    Request& v = request(id);
    v.computed = 0;  // recompute: every known token is prefilled again on re-admission
    if (!v.preempted) ++stats_.preempted_requests;
    v.preempted = true;
    ++stats_.preemptions;
    waiting_.push_front(id);  // victims are taken lowest priority first, so the queue keeps rank
    st.out.preempted.push_back(id);
    return true;
  }
  return false;
}

StepSchedule Scheduler::schedule(const KvCapacity& kv) {
  StepState st{kv, {}, {}, opts_.token_budget, {}, {}};
  for (int p = 0; p < kv.num_pools(); ++p) {
    st.free.push_back(kv.free_blocks(p));
    st.watermark.push_back(
        kv.grows(p) ? static_cast<int64_t>(std::floor(opts_.watermark * static_cast<double>(kv.total_blocks(p)))) : 0);
  }

  // 1. Decodes of running requests, by priority. One that does not fit preempts a lower-priority
  //    request; with none left it waits (holding its blocks) until a higher one releases some.
  for (size_t i = 0; i < running_.size() && st.budget > 0; ++i) {
    const Request& r = request(running_[i]);
    if (r.known - r.computed != 1) continue;
    while (!fit(st, r, 1, false, false))
      if (!preempt_below(st, i)) break;
    if (fit(st, r, 1, false, false)) take(st, r, 1);
  }
  // 2. Continuing prefill chunks (after a preemption: the recompute), by priority, shrunk to
  //    what the budget and the caches allow.
  for (size_t i = 0; i < running_.size() && st.budget > 0; ++i) {
    const Request& r = request(running_[i]);
    if (r.known - r.computed < 2 || st.is_scheduled(r.id)) continue;
    const int64_t n_max = std::min(r.known - r.computed, st.budget);
    int64_t n = 0;
    while ((n = fit(st, r, n_max, true, false)) == 0)
      if (!preempt_below(st, i)) break;
    if (n > 0) take(st, r, n);
  }
  // 3. Admissions, first come first served, unless this step preempted (vLLM: no admission in a
  //    step that had to preempt, or the queue would thrash). A request is admitted with its whole
  //    first chunk (as much as the budget allows) or waits: squeezing a sliver of a prompt into
  //    a nearly full cache would only preempt it again soon. Into an idle cache it goes with
  //    whatever fits.
  while (st.out.preempted.empty() && !waiting_.empty() && st.budget > 0 &&
         (opts_.max_running == 0 || static_cast<int>(running_.size()) < opts_.max_running)) {
    Request& r = request(waiting_.front());
    const bool idle = running_.empty();
    const int64_t n = fit(st, r, std::min(r.known, st.budget), /*shrink=*/idle, /*reserve=*/!idle);
    if (n == 0) {
      if (!r.waited) ++stats_.waited_requests;
      r.waited = true;
      break;
    }
    take(st, r, n);
    running_.push_back(r.id);
    waiting_.pop_front();
  }
  stats_.peak_running = std::max(stats_.peak_running, static_cast<int>(running_.size()));

  if (st.out.steps.empty() && st.out.preempted.empty() && !done())
    fail_too_small(kv, request(running_.empty() ? waiting_.front() : running_.front()));
  return std::move(st.out);
}

void Scheduler::fail_too_small(const KvCapacity& kv, const Request& r) const {
  // Nothing could be scheduled or preempted: the head request does not fit even with every other
  // request gone. Name the pool it overflows.
  for (int p = 0; p < kv.num_pools(); ++p) {
    const int64_t need = kv.step_blocks(p, r.computed, 1);
    if (need > kv.free_blocks(p))
      fail("KV cache too small: request ", r.id, " (", r.computed, " tokens cached) needs ", need,
           " more block(s) of pool '", kv.pool_name(p), "' for its next token, and only ",
           kv.free_blocks(p), " of its ", kv.total_blocks(p),
           " blocks are free with no other request running; give the caches more memory");
  }
  fail("Scheduler: no request can be scheduled (", running_.size(), " running, ", waiting_.size(),
       " waiting) although every pool has room for request ", r.id, "'s next token");
}

std::vector<int64_t> Scheduler::complete(const StepSchedule& s) {
  std::vector<int64_t> finished;
  for (const RequestStep& st : s.steps) {
    Request& r = request(st.req_id);
    if (st.context != r.computed || st.num_new < 1 || r.computed + st.num_new > r.known)
      fail("Scheduler::complete: request ", st.req_id, " step (context ", st.context, ", ",
           st.num_new, " new) does not match its state (", r.computed, " cached, ", r.known, " known)");
    const int64_t end = r.computed + st.num_new;
    stats_.recomputed_tokens += std::max<int64_t>(0, std::min(end, r.high_water) - r.computed);
    progress_ += std::max<int64_t>(0, end - std::max(r.high_water, r.computed));
    r.high_water = std::max(r.high_water, end);
    r.computed = end;
    if (r.computed < r.known) continue;
    if (r.known < r.total) {
      ++r.known;  // the step's last position yields the next token
      continue;
    }
    running_.erase(std::find(running_.begin(), running_.end(), r.id));
    ++finished_;
    finished.push_back(r.id);
  }
  return finished;
}

double percentile(std::vector<double> values, double p) {
  if (!(p > 0 && p <= 100)) fail_expected("percentile", "p", "in (0, 100]", p);
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  return values[std::max<size_t>(rank, 1) - 1];
}

}  // namespace dsv4::cli
