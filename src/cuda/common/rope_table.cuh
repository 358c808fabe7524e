// A RoPE cos/sin table as a kernel parameter: [max_pos, 2·half] fp32, row p holding cos(p·f_j)
// for j < half, then sin(p·f_j) (build_rope_cache's layout), rows `stride` floats apart. The
// rotation is the CPU reference's (math::rope_rotate_pair), so kernels round exactly as it does.
#pragma once

#include <cstdint>

#include "math/rope.h"
#include "dsv4/tensor.h"

namespace dsv4::cuda {

// One table row: cos θ_j at cos[j], sin θ_j at sin[j].
struct RopeAngles {
  const float* cos;
  const float* sin;
  // Rotates GPT-J pair j, (a, b) = rope dims (2j, 2j + 1), by θ_j (inverse: by −θ_j).
  __device__ __forceinline__ void rotate(int j, float& a, float& b, bool inverse = false) const {
    math::rope_rotate_pair(a, b, cos[j], inverse ? -sin[j] : sin[j]);
  }
};

struct RopeTable {
  const float* data = nullptr;
  int64_t stride = 0, max_pos = 0;
  int half = 0;  // rotated pairs per row: the rope dims / 2

  static RopeTable of(const TensorView& cos_sin) {
    return RopeTable{static_cast<const float*>(cos_sin.data), cos_sin.strides[0], cos_sin.shape[0],
                     static_cast<int>(cos_sin.shape[1] / 2)};
  }
  // Whether the table has a row for pos (positions outside it are left unrotated / unwritten by
  // the ops, never read).
  __device__ __forceinline__ bool contains(int64_t pos) const { return pos >= 0 && pos < max_pos; }
  // The angles of position pos, for kernels that rotate many pairs of one position: indexed as a
  // base plus constants (pair j0 + k), each pair's two loads are one address plus an immediate
  // instead of a 64-bit pos · stride per pair.
  __device__ __forceinline__ RopeAngles angles(int64_t pos) const {
    const float* row = data + pos * stride;
    return RopeAngles{row, row + half};
  }
  // Rotates GPT-J pair j, (a, b) = rope dims (2j, 2j + 1), to position pos (inverse: back from it).
  __device__ __forceinline__ void rotate(int64_t pos, int j, float& a, float& b,
                                         bool inverse = false) const {
    const float* row = data + pos * stride;
    math::rope_rotate_pair(a, b, row[j], inverse ? -row[half + j] : row[half + j]);
  }
};

}  // namespace dsv4::cuda
