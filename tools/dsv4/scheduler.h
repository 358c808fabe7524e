// The continuous-batching scheduler behind `dsv4 run`, after vLLM's: requests wait in a FCFS
// queue and are admitted while the paged KV caches can take them; every step spends a token
// budget on the running requests (decodes first, then continuing prefill chunks) and then on
// admissions. When a running request's next step does not fit the caches, the lowest-priority
// running request (the latest admitted) is preempted: its caches are released and it goes back
// to the front of the queue, to be recomputed from position 0 (vLLM's recompute preemption).
//
// The scheduler never touches the caches itself. It sees them through KvCapacity (free blocks,
// and the blocks a step would take, counted the way the layers check a step before running it)
// and returns the requests the caller must release; so a step it plans always passes the
// layers' capacity check, and it is unit-testable against a model of the caches.
//
// A request is `prompt` tokens, then `decode_steps` more, one per step: a position past the
// prompt becomes known once the step before it ran (it stands for the sampled token). After a
// preemption all known tokens are prefilled again (in chunks); the schedule depends only on the
// requests, the budget and the pool sizes, never on timing, so a run is reproducible.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsv4/batch.h"

namespace dsv4::cli {

// The paged caches as the scheduler sees them: a set of block pools.
class KvCapacity {
 public:
  virtual ~KvCapacity() = default;
  virtual int num_pools() const = 0;
  virtual std::string pool_name(int pool) const = 0;  // for messages: "layer 2 swa"
  virtual int64_t total_blocks(int pool) const = 0;
  virtual int64_t free_blocks(int pool) const = 0;
  // New blocks `pool` must have free before a step grows a request from `context` to
  // `context + num_new` tokens (context 0: a request the caches do not hold), counted as the
  // layers' pre-step check counts them: blocks the step itself recycles earn no credit.
  // Non-decreasing in num_new.
  virtual int64_t step_blocks(int pool, int64_t context, int64_t num_new) const = 0;
  // Blocks request `req` holds in `pool` now (what releasing it returns; 0 if it holds none).
  virtual int64_t held_blocks(int pool, int64_t req) const = 0;
  // Whether a running request takes more blocks of `pool` as it advances (false: a fixed
  // reservation made on its first step, like a compressor's state ring).
  virtual bool grows(int pool) const = 0;
};

struct SchedulerOptions {
  int64_t token_budget = 256;  // tokens per step (decodes count one each): `--chunk`
  int max_running = 0;         // requests running at once; 0: as many as the caches hold
  // Admissions leave this fraction of every growing pool free (vLLM's watermark), so the running
  // requests' next decode blocks are not taken by a new prompt right away. Ignored when nothing
  // runs: a request that fits an empty cache is always admitted.
  double watermark = 0.01;
};

struct SchedulerStats {
  int64_t waited_requests = 0;     // distinct requests that waited in the queue for cache space
  int64_t preemptions = 0;         // preemption events
  int64_t preempted_requests = 0;  // distinct requests preempted at least once
  int64_t recomputed_tokens = 0;   // tokens computed again after a preemption
  int peak_running = 0;            // most requests running at once
};

struct StepSchedule {
  // The step's requests (running ones first, then admissions); BatchPlan::make orders them
  // decodes first. Empty when the step only preempted (call schedule() again).
  std::vector<RequestStep> steps;
  // Running requests preempted by this step: release their caches before running it.
  std::vector<int64_t> preempted;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions opts);

  // Queues a request (ids unique). Throws dsv4::Error for prompt < 1 or decode_steps < 0.
  void add_request(int64_t id, int64_t prompt, int64_t decode_steps);

  // Plans the next step against the caches' current state. Throws dsv4::Error naming the pool
  // when a request cannot run even alone in an otherwise empty cache.
  StepSchedule schedule(const KvCapacity& kv);
  // After the step of `s` ran: advances its requests and returns those that finished (release
  // their caches).
  std::vector<int64_t> complete(const StepSchedule& s);

  bool done() const { return running_.empty() && waiting_.empty(); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t num_finished() const { return finished_; }
  // Positions computed for the first time, over all requests (recomputation not counted).
  int64_t progress_tokens() const { return progress_; }
  const SchedulerStats& stats() const { return stats_; }

 private:
  struct Request {
    int64_t id = 0, prompt = 0, total = 0;  // total = prompt + decode_steps positions
    int64_t known = 0;     // positions known so far (prompt, then one more per decoded step)
    int64_t computed = 0;  // positions in the caches
    int64_t high_water = 0;  // most positions ever computed (recomputation below it)
    bool waited = false, preempted = false;
    bool finished() const { return computed == total; }
  };
  struct StepState;  // one schedule() call's free blocks, budget and bookkeeping

  Request& request(int64_t id);
  // Largest n in [1, n_max] whose blocks fit (n_max only, unless shrink), 0 if none; keeps
  // `reserve` blocks of each pool free.
  int64_t fit(const StepState& st, const Request& r, int64_t n_max, bool shrink, bool reserve) const;
  void take(StepState& st, const Request& r, int64_t n);
  // Preempts the lowest-priority running request that is not scheduled this step and ranks
  // below running_[pos]; false if there is none.
  bool preempt_below(StepState& st, size_t pos);
  [[noreturn]] void fail_too_small(const KvCapacity& kv, const Request& r) const;

  SchedulerOptions opts_;
  std::vector<Request> requests_;
  std::unordered_map<int64_t, size_t> index_;  // id -> requests_ slot
  std::vector<int64_t> running_;  // admission order: priority, highest first
  std::deque<int64_t> waiting_;   // FCFS; preempted requests go back to the front
  SchedulerStats stats_;
  int64_t finished_ = 0, progress_ = 0;
};

// The p-th percentile (0 < p <= 100) of `values` by the nearest-rank method; 0 if empty.
double percentile(std::vector<double> values, double p);

}  // namespace dsv4::cli
