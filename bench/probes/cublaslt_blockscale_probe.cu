// Which cuBLASLt block-scaled FP8 configurations does this GPU + cuBLASLt accept, and are their
// results right? y[T,N] = x[T,K] · w[N,K]^T with 1x128 activation scales and 128x128 weight scales.
// Prints one line per configuration: supported or not, and the max relative error vs fp64.
// Development probe (not part of the library); build: nvcc -O2 -arch=sm_90a probe.cu -lcublasLt
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#define CK(x) do { auto e = (x); if (e != 0) { printf("error %d at %s:%d\n", (int)e, __FILE__, __LINE__); return 1; } } while (0)

int main() {
  const int T = 256, N = 512, K = 1024;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<__nv_fp8_e4m3> x(T * K), w(N * K);
  std::vector<float> xs((K / 128) * T), ws((N / 128) * (K / 128));  // xs: [K/128][T]; ws: [N/128][K/128]
  for (auto& v : x) v = __nv_fp8_e4m3(u(rng) * 4);
  for (auto& v : w) v = __nv_fp8_e4m3(u(rng) * 4);
  for (auto& v : xs) v = std::ldexp(1.0f, (int)(rng() % 5) - 2);
  for (auto& v : ws) v = std::ldexp(1.0f, (int)(rng() % 5) - 2);
  std::vector<double> ref(T * N);
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += (double)float(x[t * K + k]) * xs[(k / 128) * T + t] * (double)float(w[n * K + k]) * ws[(n / 128) * (K / 128) + k / 128];
      ref[t * N + n] = s;
    }
  void *dx, *dw, *dxs, *dws, *dy, *dwork;
  CK(cudaMalloc(&dx, T * K)); CK(cudaMalloc(&dw, N * K));
  CK(cudaMalloc(&dxs, xs.size() * 4)); CK(cudaMalloc(&dws, ws.size() * 4));
  CK(cudaMalloc(&dy, T * N * 2)); CK(cudaMalloc(&dwork, 32 << 20));
  CK(cudaMemcpy(dx, x.data(), T * K, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, w.data(), N * K, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dxs, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dws, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  cublasLtHandle_t h;
  CK(cublasLtCreate(&h));
  printf("cublasLt version %zu\n", cublasLtGetVersion());
  // cfg 0: A = w (BLK128x128), B = x (VEC128): D col-major [N, T] = y row-major.
  // cfg 1: A = x (VEC128), B = w (BLK128x128): D col-major [T, N] = y^T row-major.
  // cfg 2: as cfg 1 with D (and C) in row order: y row-major.
  // cfg 3: as cfg 0, weight scales given K-major ([K/128][N/128]).
  for (int cfg = 0; cfg < 4; ++cfg) {
    const bool a_is_w = cfg == 0 || cfg == 3;
    const int m = a_is_w ? N : T, n = a_is_w ? T : N;
    cublasLtMatmulDesc_t desc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    int32_t am = a_is_w ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    int32_t bm = a_is_w ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm)));
    const void* as = a_is_w ? dws : dxs;
    const void* bs = a_is_w ? dxs : dws;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &as, sizeof(as)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bs, sizeof(bs)));
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, m, K));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, n, K));
    if (cfg == 2) {
      CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, n));
      cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
      CK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof(row)));
    } else {
      CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m));
    }
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = 32 << 20;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t res{};
    int got = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &got);
    if (st != CUBLAS_STATUS_SUCCESS || got == 0) {
      printf("cfg %d: not supported (status %d, %d algos)\n", cfg, (int)st, got);
      continue;
    }
    if (cfg == 3) {  // weight scales transposed: [K/128][N/128]
      std::vector<float> wt(ws.size());
      for (int a = 0; a < N / 128; ++a)
        for (int b = 0; b < K / 128; ++b) wt[b * (N / 128) + a] = ws[a * (K / 128) + b];
      CK(cudaMemcpy(dws, wt.data(), wt.size() * 4, cudaMemcpyHostToDevice));
    }
    float alpha = 1, beta = 0;
    const void* A = a_is_w ? dw : dx;
    const void* B = a_is_w ? dx : dw;
    st = cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, dy, lc, dy, lc, &res.algo, dwork, wsb, 0);
    CK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> y(T * N);
    CK(cudaMemcpy(y.data(), dy, T * N * 2, cudaMemcpyDeviceToHost));
    double err = 0, den = 0, err_t = 0;
    for (int t = 0; t < T; ++t)
      for (int nn = 0; nn < N; ++nn) {
        const double r = ref[t * N + nn];
        // row-major y[t][n] at t*N+n; transposed y^T[n][t] at n*T+t
        err = std::max(err, std::fabs((double)__bfloat162float(y[t * N + nn]) - r));
        err_t = std::max(err_t, std::fabs((double)__bfloat162float(y[nn * T + t]) - r));
        den = std::max(den, std::fabs(r));
      }
    printf("cfg %d: supported (status %d), max rel err as y %.3e, as y^T %.3e\n", cfg, (int)st, err / den, err_t / den);
    if (cfg == 3) CK(cudaMemcpy(dws, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  }
  // Variations of cfg 0 (the orientation the library uses): which preference / type breaks it.
  for (int var = 0; var < 6; ++var) {
    const int Tv = var == 5 ? 1 : T;
    cublasLtMatmulDesc_t desc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dws, sizeof(dws)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dxs, sizeof(dxs)));
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, Tv, K));
    CK(cublasLtMatrixLayoutCreate(&lc, var == 3 ? CUDA_R_32F : CUDA_R_16BF, N, Tv, N));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = var == 2 ? 0 : (32 << 20);
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    if (var == 0) {
      uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
    }
    if (var == 1) {
      uint32_t al = 256;
      for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        CK(cublasLtMatmulPreferenceSetAttribute(pref, a, &al, sizeof(al)));
    }
    cublasLtMatmulHeuristicResult_t res{};
    int got = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &got);
    const char* what[] = {"reduction mask without INPLACE", "alignment prefs 256", "workspace 0",
                          "D fp32", "(unused)", "T = 1"};
    printf("cfg 0 + %s: %s (status %d, %d algos)\n", what[var], st == 0 && got > 0 ? "supported" : "NOT supported", (int)st, got);
  }
  // Which token counts T does each orientation take (default preferences, 32 MiB workspace)?
  for (int cfg = 0; cfg < 2; ++cfg) {
    printf("cfg %d T:", cfg);
    for (int Tv : {1, 2, 3, 4, 5, 8, 12, 15, 16, 17, 24, 32, 100, 227, 228, 256}) {
      cublasLtMatmulDesc_t desc;
      CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, cfg == 0 ? &blk : &vec, 4));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, cfg == 0 ? &vec : &blk, 4));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, cfg == 0 ? &dws : &dxs, sizeof(void*)));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, cfg == 0 ? &dxs : &dws, sizeof(void*)));
      const int m = cfg == 0 ? N : Tv, n = cfg == 0 ? Tv : N;
      cublasLtMatrixLayout_t la, lb, lc;
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, m, K));
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, n, K));
      CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m));
      cublasLtMatmulPreference_t pref;
      CK(cublasLtMatmulPreferenceCreate(&pref));
      size_t wsb = 32 << 20;
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
      cublasLtMatmulHeuristicResult_t res{};
      int got = 0;
      cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &got);
      printf(" %d:%s", Tv, st == 0 && got > 0 ? "ok" : "NO");
    }
    printf("\n");
  }
  // Small N / K (the tiny test config's projections), bf16 and fp32 outputs, T = 128.
  for (int dt = 0; dt < 2; ++dt) {
    printf("cfg 0 T=128 y %s N,K:", dt ? "fp32" : "bf16");
    for (auto [Nv, Kv] : {std::pair{128, 128}, {128, 256}, {256, 128}, {256, 256}, {64, 256}, {128, 512}, {512, 128}}) {
      cublasLtMatmulDesc_t desc;
      CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &blk, 4));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, 4));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dws, sizeof(void*)));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dxs, sizeof(void*)));
      cublasLtMatrixLayout_t la, lb, lc;
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, Kv, Nv, Kv));
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, Kv, 128, Kv));
      CK(cublasLtMatrixLayoutCreate(&lc, dt ? CUDA_R_32F : CUDA_R_16BF, Nv, 128, Nv));
      for (size_t wsb : {size_t{0}, size_t{32} << 20}) {
        cublasLtMatmulPreference_t pref;
        CK(cublasLtMatmulPreferenceCreate(&pref));
        CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
        cublasLtMatmulHeuristicResult_t res{};
        int got = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &got);
        printf(" %dx%d/ws%d:%s", Nv, Kv, wsb ? 1 : 0, st == 0 && got > 0 ? "ok" : "NO");
      }
    }
    printf("\n");
  }
  return 0;
}
