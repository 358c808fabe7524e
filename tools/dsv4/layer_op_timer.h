// Per-op timing of a layer forward for `dsv4 bench layer`, through the layer's OpTimer hook
// (include/dsv4/layer.h): the layer calls begin(op) before each op's launches and end() after
// the last, so op i lasts from its begin to the next begin (or end).
//
// Two clocks per op:
//   gpu_us  — CUDA backend: the stream time between CUDA events recorded at those points. It is
//             the op's kernels plus any time the GPU sat idle waiting for the host inside that
//             span (a forward that synchronizes, or whose host work outruns the kernels, shows
//             it here; a device-resident forward does not). CPU backend: the host clock (the CPU
//             ops run synchronously).
//   host_us — the host time between the same calls: planning, uploads and launch overhead (the
//             part graph replay removes).
#pragma once

#include <chrono>
#include <utility>
#include <string>
#include <vector>

#include "dsv4/layer.h"
#include "runtime/device_runtime.h"

namespace dsv4::bench {

struct OpTime {
  std::string name;
  double gpu_us = 0;
  double host_us = 0;
};

// The ops of one forward, in the order the layer first marked them (a name marked twice in one
// forward adds up).
struct ForwardTimes {
  std::vector<OpTime> ops;
  double gpu_us = 0;   // first begin → end
  double host_us = 0;
};

class TimingOpTimer : public OpTimer {
 public:
  // While disabled, begin/end record nothing (a forward timed for its wall clock only).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  bool active() const override { return enabled_; }
  // The last completed forward's times (waits for its events on CUDA). Throws dsv4::Error if
  // no forward was marked since the last collect(), or it did not reach end().
  virtual ForwardTimes collect() = 0;
  // Forgets whatever was marked since the last collect() (a warm-up forward, or one that threw).
  virtual void reset() = 0;
  // The GPU time of the last decode-graph replay bracketed through graph_launch() since the last
  // call (waits for it), or a negative value when none was (an eager step, the CPU backend).
  virtual double take_graph_us() { return -1.0; }
  // Host clock at the last bracketed graph launch's start and end (Clock::time_point{} if none).
  std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point> graph_launch_span() const {
    return {launch_began_, launch_ended_};
  }
  // Notes the host clock at each host_phase() of the forward (kept until take_host_phases()).
  void host_phase(const char* phase) override { host_phases_.push_back({phase, Clock::now()}); }
  // The phases noted since the last call, in order.
  std::vector<std::pair<const char*, std::chrono::steady_clock::time_point>> take_host_phases() {
    return std::exchange(host_phases_, {});
  }

 protected:
  using Clock = std::chrono::steady_clock;
  bool enabled_ = true;
  Clock::time_point launch_began_{}, launch_ended_{};
  std::vector<std::pair<const char*, Clock::time_point>> host_phases_;
};

// Host clocks only (the CPU backend).
class HostOpTimer final : public TimingOpTimer {
 public:
  void begin(const char* op, Stream stream) override;
  void end(Stream stream) override;
  ForwardTimes collect() override;
  void reset() override;

 private:
  std::vector<std::string> names_;
  std::vector<Clock::time_point> marks_;  // one per begin, then the end
  bool ended_ = false;
};

// CUDA events on the layer's stream (the CUDA backend); host clocks beside them. Constructing
// one in a build without CUDA throws dsv4::Error.
class CudaEventOpTimer final : public TimingOpTimer {
 public:
  CudaEventOpTimer();

  void begin(const char* op, Stream stream) override;
  void end(Stream stream) override;
  ForwardTimes collect() override;
  void reset() override;
  // While disabled (the wall-clock steps), brackets each graph replay with two events.
  void graph_launch(Stream stream, bool before) override;
  double take_graph_us() override;

 private:
  void record(Stream stream);
  rt::Event graph_begin_{/*timing=*/true}, graph_end_{/*timing=*/true};
  bool graph_bracketed_ = false;
  std::vector<rt::Event> events_;  // timing events, a pool reused by every forward
  size_t used_ = 0;            // events recorded in the current forward
  std::vector<std::string> names_;
  std::vector<Clock::time_point> host_marks_;
  bool ended_ = false;
};

// Folds repeated forwards: per op the median over forwards (ops in first-seen order), and the
// median of the forward totals.
ForwardTimes median_times(const std::vector<ForwardTimes>& runs);
double median(std::vector<double> v);

}  // namespace dsv4::bench
