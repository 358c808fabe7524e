// Instance of the indexer scores kernel for 129..256 index heads: 1 token per CTA.
#include "cuda/indexer/scores/kernel.cuh"

namespace dsv4::cuda::indexer_scores_detail {
template void launch_scores<256, 256>(const Params&, int, cudaStream_t);
}  // namespace dsv4::cuda::indexer_scores_detail
