#include "layer_op_timer.h"

#include <algorithm>
#include <map>

#include "dsv4/status.h"

namespace dsv4::bench {

namespace {

double us_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Adds op i's times under its name, keeping first-seen order.
void add_op(ForwardTimes& out, const std::string& name, double gpu_us, double host_us) {
  for (OpTime& o : out.ops)
    if (o.name == name) {
      o.gpu_us += gpu_us;
      o.host_us += host_us;
      return;
    }
  out.ops.push_back({name, gpu_us, host_us});
}

void require_complete(const std::vector<std::string>& names, bool ended) {
  if (names.empty()) fail("bench layer: op timer: no op was marked since the last collect()");
  if (!ended) fail("bench layer: op timer: the forward marked ops but never called end()");
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

ForwardTimes median_times(const std::vector<ForwardTimes>& runs) {
  ForwardTimes out;
  std::vector<std::string> order;
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> per_op;
  std::vector<double> gpu, host;
  for (const ForwardTimes& r : runs) {
    gpu.push_back(r.gpu_us);
    host.push_back(r.host_us);
    for (const OpTime& o : r.ops) {
      if (!per_op.count(o.name)) order.push_back(o.name);
      per_op[o.name].first.push_back(o.gpu_us);
      per_op[o.name].second.push_back(o.host_us);
    }
  }
  for (const std::string& name : order) {
    auto& [g, h] = per_op[name];
    // An op missing from some forwards took 0 there.
    g.resize(runs.size(), 0.0);
    h.resize(runs.size(), 0.0);
    out.ops.push_back({name, median(g), median(h)});
  }
  out.gpu_us = median(gpu);
  out.host_us = median(host);
  return out;
}

// ---- host clocks --------------------------------------------------------------------------

void HostOpTimer::begin(const char* op, Stream) {
  if (!enabled_) return;
  names_.emplace_back(op);
  marks_.push_back(Clock::now());
  ended_ = false;
}

void HostOpTimer::end(Stream) {
  if (!enabled_ || names_.empty()) return;
  marks_.push_back(Clock::now());
  ended_ = true;
}

ForwardTimes HostOpTimer::collect() {
  require_complete(names_, ended_);
  ForwardTimes out;
  for (size_t i = 0; i < names_.size(); ++i) {
    const double us = us_between(marks_[i], marks_[i + 1]);
    add_op(out, names_[i], us, us);
  }
  out.gpu_us = out.host_us = us_between(marks_.front(), marks_.back());
  reset();
  return out;
}

void HostOpTimer::reset() {
  names_.clear();
  marks_.clear();
  ended_ = false;
}

// ---- CUDA events --------------------------------------------------------------------------

CudaEventOpTimer::CudaEventOpTimer() {
  if (!rt::built()) fail("bench layer: CUDA event timer: this build has no CUDA backend");
}

void CudaEventOpTimer::record(Stream stream) {
  if (used_ == events_.size()) events_.emplace_back(/*timing=*/true);  // grows in the first forwards only
  events_[used_].record(stream);
  ++used_;
  host_marks_.push_back(Clock::now());
}

void CudaEventOpTimer::begin(const char* op, Stream stream) {
  if (!enabled_) return;
  names_.emplace_back(op);
  ended_ = false;
  record(stream);
}

void CudaEventOpTimer::end(Stream stream) {
  if (!enabled_ || names_.empty()) return;
  record(stream);
  ended_ = true;
}

ForwardTimes CudaEventOpTimer::collect() {
  require_complete(names_, ended_);
  // elapsed_ms waits for the later event of each pair.
  auto us = [&](size_t a, size_t b) { return 1000.0 * rt::Event::elapsed_ms(events_[a], events_[b]); };
  ForwardTimes out;
  for (size_t i = 0; i < names_.size(); ++i)
    add_op(out, names_[i], us(i, i + 1), us_between(host_marks_[i], host_marks_[i + 1]));
  out.gpu_us = us(0, used_ - 1);
  out.host_us = us_between(host_marks_.front(), host_marks_.back());
  reset();
  return out;
}

void CudaEventOpTimer::graph_launch(Stream stream, bool before) {
  if (enabled_) return;  // an op-timed forward runs eagerly; its events already span it
  if (before) {
    launch_began_ = Clock::now();
    graph_begin_.record(stream);
  } else {
    graph_end_.record(stream);
    launch_ended_ = Clock::now();
  }
  graph_bracketed_ = !before;
}

double CudaEventOpTimer::take_graph_us() {
  if (!graph_bracketed_) return -1.0;
  graph_bracketed_ = false;
  return 1000.0 * rt::Event::elapsed_ms(graph_begin_, graph_end_);
}

// The pool's events may still be pending on the stream; re-recording them later is allowed.
void CudaEventOpTimer::reset() {
  names_.clear();
  host_marks_.clear();
  used_ = 0;
  ended_ = false;
}

}  // namespace dsv4::bench
