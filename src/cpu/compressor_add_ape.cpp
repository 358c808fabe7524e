// The CPU kernel of compressor_project's last step: the learned positional bias of the scores.
#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace dsv4::cpu {

void compressor_add_ape(const CompressorConfig& cfg, const TensorView& ape,
                        const TensorView& positions, const TensorView& score_rows,
                        Stream /*stream*/) {
  const int64_t T = score_rows.size(0), width = cfg.proj_width();
  // The learned positional bias of the score: row p mod r of ape.
  const float* ape_base = ape.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* bias = ape_base + (load_index(positions, t) % cfg.ratio) * ape.stride(0);
    float* s = score_rows.ptr<float>() + t * score_rows.stride(0);
    for (int64_t c = 0; c < width; ++c) s[c] += bias[c];
  }
}

}  // namespace dsv4::cpu
