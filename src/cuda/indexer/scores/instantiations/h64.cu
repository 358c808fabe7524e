// Instances of the indexer scores kernel for up to 64 index heads (V4: 64): 1, 2 or 4 tokens per
// CTA (one file per head padding: parallel builds).
#include "cuda/indexer/scores/kernel.cuh"

namespace dsv4::cuda::indexer_scores_detail {
template void launch_scores<64, 64>(const Params&, int, cudaStream_t);
template void launch_scores<128, 64>(const Params&, int, cudaStream_t);
template void launch_scores<256, 64>(const Params&, int, cudaStream_t);
}  // namespace dsv4::cuda::indexer_scores_detail
