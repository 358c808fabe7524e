// The ceilings a layer's floor is measured against (`dsv4 bench layer`), measured in the same run
// as the cases they judge (clocks, driver and board differ between lent machines):
//   CUDA: FP8 e4m3 and bf16 tensor-core GEMMs through cuBLASLt (8192³ by default, TN, fp32
//         accumulation, bf16 out, 32 MiB workspace: the heuristic's best kernel), and the HBM copy
//         bandwidth of a 1 GiB device-to-device cudaMemcpyAsync (bytes read + written); median of
//         `reps` CUDA-event-timed calls after 3 warm-ups, on random data.
//   CPU:  the same three through the CPU reference ops (dsv4::linear with bf16 and FP8 weights)
//         and memcpy — only so the CPU backend's report has finite floors (a plumbing check, not a
//         statement about the CPU).
#pragma once

#include <string>

#include "layer_cost_model.h"

namespace dsv4::bench {

struct MeasuredCeilings {
  Ceilings value;
  std::string fp8_how, bf16_how, copy_how;  // what was timed
};

MeasuredCeilings measure_cuda_ceilings(int gemm_size = 8192, int reps = 20);
MeasuredCeilings measure_cpu_ceilings();

}  // namespace dsv4::bench
