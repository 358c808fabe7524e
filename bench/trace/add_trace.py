# Development tool, not part of the build: inserts the buffered clock64 trace of
# docs/notes/prefill.md (v8) into src/cuda/attention/sparse_prefill/kernel.cuh (a text patch of
# the kernel as of commit 6b104c3; run it in a scratch tree, build with -DDSV4_PREFILL_TRACE, set
# DSV4_PREFILL_TRACE=<file> for `dsv4 bench`, summarise with trace_summary.py). Without the macro
# every trace point compiles to nothing.
p='src/cuda/attention/sparse_prefill/kernel.cuh'
s=open(p).read()
def rep(old,new):
    global s
    assert s.count(old)==1, old
    s=s.replace(old,new)
rep('''__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }  // ex2.approx
''','''__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }  // ex2.approx

#if defined(DSV4_PREFILL_TRACE)
static __device__ long long prefill_trace[256][16];
#define DSV4_TRACE(row, col)                                                                  \\
  do {                                                                                       \\
    if (blockIdx.x == 0 && tid == 0 && (row) < 256) prefill_trace[(row)][(col)] = clock64(); \\
  } while (0)
#else
#define DSV4_TRACE(row, col) \\
  do {                       \\
  } while (0)
#endif
''')
rep('''        if (g >= 2) ptx::mbarrier_wait(&plan.k_empty[buf], ((g >> 1) - 1) & 1);
''','''        DSV4_TRACE(g, 0);
        if (g >= 2) ptx::mbarrier_wait(&plan.k_empty[buf], ((g >> 1) - 1) & 1);
        DSV4_TRACE(g, 1);
''')
rep('''        gather_blocks(0, Cfg::kSplitBlocks);
        ptx::cp_async_arrive_noinc(&plan.k_full[buf][0]);
        gather_blocks(Cfg::kSplitBlocks, kBlocks);
        ptx::cp_async_arrive_noinc(&plan.k_full[buf][1]);
''','''        gather_blocks(0, Cfg::kSplitBlocks);
        ptx::cp_async_arrive_noinc(&plan.k_full[buf][0]);
        DSV4_TRACE(g, 2);
        gather_blocks(Cfg::kSplitBlocks, kBlocks);
        ptx::cp_async_arrive_noinc(&plan.k_full[buf][1]);
        DSV4_TRACE(g, 3);
''')
rep('''      auto release_own_tile = [&](int t) {
        if (t >= 2) ptx::mbarrier_arrive(&plan.k_empty[buf_of(t)]);''','''      auto release_own_tile = [&](int t) {
        if (t >= 2) DSV4_TRACE(g + t - 2, 10);
        if (t >= 2) ptx::mbarrier_arrive(&plan.k_empty[buf_of(t)]);''')
rep('''        const uint32_t phase = ((g + t) >> 1) & 1;
        ptx::mbarrier_wait(&plan.k_full[buf_of(t)][0], phase);
        wgmma_ss<0, Cfg::kSplitKSteps>(MmaS{}, sQ, k_tile(buf_of(t)), rS, /*zero_init=*/true);
        ptx::mbarrier_wait(&plan.k_full[buf_of(t)][1], phase);''','''        const uint32_t phase = ((g + t) >> 1) & 1;
        DSV4_TRACE(g + t, 4);
        ptx::mbarrier_wait(&plan.k_full[buf_of(t)][0], phase);
        DSV4_TRACE(g + t, 5);
        wgmma_ss<0, Cfg::kSplitKSteps>(MmaS{}, sQ, k_tile(buf_of(t)), rS, /*zero_init=*/true);
        ptx::mbarrier_wait(&plan.k_full[buf_of(t)][1], phase);
        DSV4_TRACE(g + t, 6);''')
rep('''        ptx::mbarrier_wait(&plan.p_ready[t & 1], remote_phase);''','''        DSV4_TRACE(g + t, 11);
        ptx::mbarrier_wait(&plan.p_ready[t & 1], remote_phase);
        DSV4_TRACE(g + t, 12);''')
rep('''        wgmma_ss(MmaPvSmem{}, p_tile(t, buf_of(t)), v_half(buf_of(t)), rO, false);
        wgmma_commit();''','''        wgmma_ss(MmaPvSmem{}, p_tile(t, buf_of(t)), v_half(buf_of(t)), rO, false);
        wgmma_commit();
        DSV4_TRACE(g + t, 13);''')
rep('''        ptx::mbarrier_arrive(&plan.p_ready[t & 1]);''','''        ptx::mbarrier_arrive(&plan.p_ready[t & 1]);
        DSV4_TRACE(g + t, 8);''')
rep('''        wgmma_rs(MmaPvRegs{}, rP, v_half(buf_of(t)), rO, false);
        wgmma_commit();''','''        wgmma_rs(MmaPvRegs{}, rP, v_half(buf_of(t)), rO, false);
        wgmma_commit();
        DSV4_TRACE(g + t, 9);''')
rep('''        issue_s(0);
        wgmma_wait<0>();''','''        issue_s(0);
        wgmma_wait<0>();
        DSV4_TRACE(g, 7);''')
rep('''        wgmma_wait<0>();           // P·V of tile t-1 done → its buffer is free
        ptx::mbarrier_arrive(&plan.k_empty[buf_of(t - 1)]);
        issue_s(t);                // B
        wgmma_wait<0>();           // S done''','''        wgmma_wait<0>();           // P·V of tile t-1 done → its buffer is free
        DSV4_TRACE(g + t - 1, 14);
        ptx::mbarrier_arrive(&plan.k_empty[buf_of(t - 1)]);
        issue_s(t);                // B
        wgmma_wait<0>();           // S done
        DSV4_TRACE(g + t, 7);''')
rep('''      ptx::mbarrier_wait(&plan.q_full, k & 1);
      if (wg >= n)''','''      if (wg == 0) DSV4_TRACE(g, 15);
      ptx::mbarrier_wait(&plan.q_full, k & 1);
      if (wg >= n)''')
rep('''  sparse_prefill_kernel<D_QK><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  check_launch("sparse_prefill");''','''  sparse_prefill_kernel<D_QK><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  check_launch("sparse_prefill");
#if defined(DSV4_PREFILL_TRACE)
  if (const char* path = std::getenv("DSV4_PREFILL_TRACE")) {
    static long long host[256][16];
    cudaStreamSynchronize(stream);
    cudaMemcpyFromSymbol(host, prefill_trace, sizeof(host));
    if (FILE* f = std::fopen(path, "w")) {
      for (auto& row : host) {
        for (long long v : row) std::fprintf(f, "%lld ", v);
        std::fprintf(f, "\\n");
      }
      std::fclose(f);
    }
    static const long long zeros[256][16] = {};
    cudaMemcpyToSymbol(prefill_trace, zeros, sizeof(zeros));
  }
#endif''')
s=s.replace('#include <cstdint>\n','#include <cstdint>\n#if defined(DSV4_PREFILL_TRACE)\n#include <cstdio>\n#include <cstdlib>\n#endif\n',1)
open(p,'w').write(s)

# Item-level events of WG0 (rows 240 + item index; tile rows stay below 240): epilogue start,
# after the row-sum exchange, after the factors, after the O stores, next item start.
s = open(p).read()
s = s.replace("if (blockIdx.x == 0 && tid == 0 && (row) < 256) prefill_trace",
              "if (blockIdx.x == 0 && tid == 0 && (row) < 256 && ((row) >= 240) == ((col) >= 100)) prefill_trace")
s = s.replace("prefill_trace[(row)][(col)] = clock64();", "prefill_trace[(row)][(col) % 100] = clock64();")
def ins_before(anchor, text):
    global s
    assert s.count(anchor) == 1, anchor
    s = s.replace(anchor, text + anchor)
def ins_after(anchor, text):
    global s
    assert s.count(anchor) == 1, anchor
    s = s.replace(anchor, anchor + text)
ins_before("      // ---- epilogue: total row sums across the two WGs, sink, normalise, store.",
           "      if (wg == 0) DSV4_TRACE(240 + k, 100);\n")
ins_after("      float(&row_sum)[2][kHeads] = plan.row_sum[k & 1];  // double-buffered across items",
          "\n      if (wg == 0) DSV4_TRACE(240 + k, 104);")
ins_after("      ptx::named_barrier_sync(Cfg::kBarLExchange, 256);", "\n      if (wg == 0) DSV4_TRACE(240 + k, 101);")
ins_before("      auto* out_base = static_cast<uint8_t*>(p.out)", "      if (wg == 0) DSV4_TRACE(240 + k, 102);\n")
ins_before("""      if (wg == 0 && (tid & 3) == 0) {
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          const int head = it.head0 + row0 + 8 * r;""", "      if (wg == 0) DSV4_TRACE(240 + k, 103);\n")
ins_after("      if (wg == 0) DSV4_TRACE(g, 15);", "\n      if (wg == 0 && k >= 1) DSV4_TRACE(240 + k - 1, 105);")
open(p, 'w').write(s)
