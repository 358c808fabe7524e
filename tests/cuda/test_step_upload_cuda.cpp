// StepUpload on the GPU: a step that resume()s the last one's arrays sends only the bytes it
// marked dirty, and the device buffer then reads as the host bytes — also after the buffer moved
// (a full copy then) and after a caller's capture (whose copy re-sends its own snapshot). And
// StepUpload::post (rt::PostedCopy): the plan posted without a CUDA call reaches the device
// buffer through the take kernel — run eagerly and replayed from a captured graph, whole and as
// marked bytes only — and the flow control neither loses a post nor spins forever.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dsv4/device_tensor.h"
#include "dsv4/status.h"
#include "gpu_test_util.h"
#include "layer/step_upload.h"
#include "runtime/device_runtime.h"

namespace dsv4 {
namespace {

// (after the stream that carried the copies is drained)
template <class T>
std::vector<T> device_values(const StepUpload& up, const StepUpload::Array& a) {
  rt::synchronize_device("StepUploadCuda");
  const TensorView v = up.view(a);
  HostTensor h(v.dtype, a.shape);
  copy_to_host(v, h);
  return std::vector<T>(h.data<T>(), h.data<T>() + h.numel());
}

template <class T>
std::vector<T> host_values(StepUpload& up, const StepUpload::Array& a) {
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  const T* p = up.host_data<T>(a);
  return std::vector<T>(p, p + n);
}

TEST(StepUploadCuda, ResumedStepsSendTheirDirtyBytes) {
  DSV4_SKIP_WITHOUT_GPU();
  rt::OwnedStream stream;
  StepUpload up(Device::cuda);
  up.begin();
  const StepUpload::Array pos = up.put_uninit(DType::int64, {100});
  const StepUpload::Array table = up.put_uninit(DType::int32, {50, 8});
  for (int i = 0; i < 100; ++i) up.host_data<int64_t>(pos)[i] = 1000 + i;
  for (int i = 0; i < 400; ++i) up.host_data<int32_t>(table)[i] = i;
  up.commit(stream.get());
  EXPECT_EQ(device_values<int64_t>(up, pos), host_values<int64_t>(up, pos));
  EXPECT_EQ(device_values<int32_t>(up, table), host_values<int32_t>(up, table));

  // A resumed step: positions move and table row 3 changes, both marked; row 5 changes unmarked
  // (a planner bug would look so) and must not reach the device: only dirty bytes are sent.
  up.resume();
  for (int i = 0; i < 100; ++i) up.host_data<int64_t>(pos)[i] += 1;
  up.mark_dirty(pos.offset, 100 * 8);
  for (int k = 0; k < 8; ++k) up.host_data<int32_t>(table)[3 * 8 + k] = -7;
  up.mark_dirty(table.offset + 3 * 8 * 4, 8 * 4);
  up.host_data<int32_t>(table)[5 * 8] = -9;
  up.commit(stream.get());
  EXPECT_EQ(device_values<int64_t>(up, pos), host_values<int64_t>(up, pos));
  std::vector<int32_t> want = host_values<int32_t>(up, table);
  want[5 * 8] = 5 * 8;  // unmarked: the device keeps the last commit's value
  EXPECT_EQ(device_values<int32_t>(up, table), want);

  // The device buffer moves (reserve grows it): the next commit sends everything.
  up.reserve(1 << 20);
  up.resume();
  up.host_data<int64_t>(pos)[0] = 42;
  up.mark_dirty(pos.offset, 8);
  up.commit(stream.get());
  EXPECT_EQ(device_values<int64_t>(up, pos), host_values<int64_t>(up, pos));
  EXPECT_EQ(device_values<int32_t>(up, table), host_values<int32_t>(up, table));

  // Nothing dirty: nothing sent, the device still reads the host bytes.
  up.resume();
  up.commit(stream.get());
  EXPECT_EQ(device_values<int32_t>(up, table), host_values<int32_t>(up, table));
}

// A plan of 300 positions (int64) and a [50, 8] table (int32), fresh values from `seed`.
struct Plan {
  StepUpload::Array pos, table;
};
Plan put_plan(StepUpload& up, int seed) {
  up.begin();
  Plan p{up.put_uninit(DType::int64, {300}), up.put_uninit(DType::int32, {50, 8})};
  for (int i = 0; i < 300; ++i) up.host_data<int64_t>(p.pos)[i] = seed * 1000 + i;
  for (int i = 0; i < 400; ++i) up.host_data<int32_t>(p.table)[i] = seed * 100 + i;
  return p;
}

TEST(PostedUploadCuda, EagerTakesLandThePostAndOnlyTheMarkedBytes) {
  DSV4_SKIP_WITHOUT_GPU();
  rt::OwnedStream stream;
  StepUpload up(Device::cuda);
  const Plan p = put_plan(up, 1);
  up.post(stream.get());
  up.receive(stream.get());
  up.received();
  EXPECT_EQ(device_values<int64_t>(up, p.pos), host_values<int64_t>(up, p.pos));
  EXPECT_EQ(device_values<int32_t>(up, p.table), host_values<int32_t>(up, p.table));

  // A resumed step: positions move and table row 3 changes, both marked; row 5 changes unmarked
  // and must not reach the device (only the marked span is posted). Row 3 is far from the
  // positions, so the span covers rows 0..3 of the table and not row 5.
  up.resume();
  for (int i = 0; i < 300; ++i) up.host_data<int64_t>(p.pos)[i] += 1;
  up.mark_dirty(p.pos.offset, 300 * 8);
  for (int k = 0; k < 8; ++k) up.host_data<int32_t>(p.table)[3 * 8 + k] = -7;
  up.mark_dirty(p.table.offset + 3 * 8 * 4, 8 * 4);
  up.host_data<int32_t>(p.table)[5 * 8] = -9;
  up.post(stream.get());
  up.receive(stream.get());
  up.received();
  EXPECT_EQ(device_values<int64_t>(up, p.pos), host_values<int64_t>(up, p.pos));
  std::vector<int32_t> want = host_values<int32_t>(up, p.table);
  want[5 * 8] = 100 + 5 * 8;  // unmarked: the device keeps the last post's value
  EXPECT_EQ(device_values<int32_t>(up, p.table), want);
}

TEST(PostedUploadCuda, AReplayedGraphTakesEachPostOfItsTime) {
  DSV4_SKIP_WITHOUT_GPU();
  rt::OwnedStream stream, capture;
  StepUpload up(Device::cuda);
  Plan p = put_plan(up, 1);
  up.reserve(64 << 10);  // the device buffer must not move after the capture
  up.post(stream.get());
  // The graph is captured on a stream of its own (as DecodeGraphs does) and replayed on `stream`.
  const rt::Graph graph = rt::Graph::capture(capture.get(), [&] { up.receive(capture.get()); });
  graph.launch(stream.get());
  up.received();
  EXPECT_EQ(device_values<int64_t>(up, p.pos), host_values<int64_t>(up, p.pos));
  for (int seed = 2; seed < 6; ++seed) {
    if (seed % 2 == 0) {  // a whole new plan
      p = put_plan(up, seed);
    } else {  // a patched one: positions only
      up.resume();
      for (int i = 0; i < 300; ++i) up.host_data<int64_t>(p.pos)[i] = -seed * 1000 - i;
      up.mark_dirty(p.pos.offset, 300 * 8);
    }
    up.post(stream.get());
    graph.launch(stream.get());
    up.received();
    ASSERT_EQ(device_values<int64_t>(up, p.pos), host_values<int64_t>(up, p.pos)) << seed;
    ASSERT_EQ(device_values<int32_t>(up, p.table), host_values<int32_t>(up, p.table)) << seed;
  }
  // Back to back, no synchronization between steps: each post waits for the last to be taken.
  for (int seed = 10; seed < 20; ++seed) {
    up.resume();
    for (int i = 0; i < 300; ++i) up.host_data<int64_t>(p.pos)[i] = seed * 7 + i;
    up.mark_dirty(p.pos.offset, 300 * 8);
    up.post(stream.get());
    graph.launch(stream.get());
    up.received();
  }
  EXPECT_EQ(device_values<int64_t>(up, p.pos), host_values<int64_t>(up, p.pos));
}

TEST(PostedUploadCuda, APostWhoseLaunchNeverCameIsSettled) {
  DSV4_SKIP_WITHOUT_GPU();
  rt::OwnedStream stream;
  StepUpload up(Device::cuda);
  const Plan p = put_plan(up, 1);
  up.post(stream.get());  // its forward "threw": no take, no received()
  const Plan q = put_plan(up, 2);
  up.post(stream.get());  // settles the last post, then posts this one
  up.receive(stream.get());
  up.received();
  EXPECT_EQ(device_values<int64_t>(up, q.pos), host_values<int64_t>(up, q.pos));
  (void)p;
}

TEST(PostedUploadCuda, AStreamThatFinishedWithoutTakingThrowsInsteadOfSpinning) {
  DSV4_SKIP_WITHOUT_GPU();
  rt::OwnedStream stream;
  StepUpload up(Device::cuda);
  put_plan(up, 1);
  up.post(stream.get());
  up.received();  // a caller bug: confirmed, though no take was enqueued
  put_plan(up, 2);
  EXPECT_THROW(up.post(stream.get()), Error);
}

}  // namespace
}  // namespace dsv4
