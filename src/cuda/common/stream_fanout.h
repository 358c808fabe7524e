// Fan-out of independent pieces of one op over several streams, on behalf of the caller's stream.
//
// Piece 0 runs on the caller's stream, pieces 1..n-1 on side streams that first wait for it
// (an event recorded on the caller's stream); the caller's stream then waits for every side
// stream. So the op stays ordered on the caller's stream exactly as if it ran there, and inside a
// stream capture (the layer's decode graphs, torch.cuda.graph) the pieces become parallel
// branches of the graph. The side streams and events are pooled per device and host thread,
// created on first use (in relaxed capture mode, so a first use inside a capture is legal) and
// kept for the process's lifetime, as serving engines keep their stream pools.
//
// Why: grouped_wo_a's FP8 groups are G block-scaled GEMMs of T × L outputs each; at decode sizes
// one of them fills a handful of SMs, so back to back they leave the GPU mostly idle.
#pragma once

#include <functional>

#include "dsv4/ops.h"

namespace dsv4::cuda {

// At most this many streams (the caller's and kMaxFanout - 1 side streams) run an op's pieces.
inline constexpr int kMaxFanout = 16;

// Runs piece(i, stream_i) for i = 0..n-1 as described above (n >= 1), piece i on stream i mod
// kMaxFanout (0: the caller's). Pieces must not depend on one another. If a piece throws, the side
// streams are still joined into `stream` before the exception propagates.
void run_fanned_out(const char* where, Stream stream, int n,
                    const std::function<void(int piece, Stream piece_stream)>& piece);

}  // namespace dsv4::cuda
