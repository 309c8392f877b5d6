// Host and device time of one GEMM as Transformer Engine v2.9 issues it, and of the local
// experts' GEMMs as its GroupedLinear runs them (issues 28/29: the MoE rows' per-layer floor).
//
// What TE v2.9 does per GEMM (transformer_engine/common/gemm/cublaslt_gemm.cu, `cublas_gemm`,
// lines 413-754): four matrix layouts created (A, B, C, D), one matmul descriptor created and
// its attributes set (transposes, epilogue; for FP8 fast accumulation, the A/B scale pointers
// and scale modes), one preference created with its workspace size and four alignments,
// `cublasLtMatmulAlgoGetHeuristic` asked for one algorithm, `cublasLtMatmul`, then every
// descriptor destroyed: nothing is cached between calls. GroupedLinear's pass
// (`multi_stream_cublas_gemm`, lines 924-977): an event on the caller's stream that each of
// min(4, e) compute streams waits for, expert i's GEMM on stream i % 4, then an event on each
// stream that the caller's stream waits for. The workspace is 32 MiB + 1 KiB on Hopper
// (transformer_engine/pytorch/module/base.py, `get_cublas_workspace_size_bytes`).
//
// This program is written here from that description (no TE code in it) and prints one JSON
// object: per case, the host microseconds per GEMM of (a) TE's sequence, (b) the heuristic
// alone, (c) `cublasLtMatmul` alone with the descriptors and algorithm kept, the device
// microseconds of one GEMM, and per GroupedLinear pass of e experts the host issue time, the
// wall time of passes issued back to back, and the device time of one GEMM of all e·M rows.
//
//   nvcc -O2 -std=c++17 te_gemm_host.cu -I$CUBLAS/include -L$CUBLAS/lib -lcublasLt -o te_gemm_host
//   ./te_gemm_host > te_gemm_host.json
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::fprintf(stderr, "CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
  std::exit(1); } } while (0)
#define LT(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
  std::fprintf(stderr, "cuBLAS status %d at %s:%d\n", (int)s_, __FILE__, __LINE__); \
  std::exit(1); } } while (0)

using Clock = std::chrono::steady_clock;
static double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

static const size_t kWorkspace = 32u * 1024u * 1024u + 1024u;   // TE on Hopper

struct Gemm {        // column-major D(m x n) = A^T(m x k) B(k x n), TE's forward layout
  int m, n, k;       // m: output features, n: tokens, k: input features
  bool fp8;          // A, B e4m3 with per-tensor scales, D bf16; else all bf16
  void *A, *B, *D;
  float *scale;      // device 1.0f for the FP8 scale pointers
  void *work;
};

static cudaDataType_t in_type(const Gemm &g) { return g.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF; }

static size_t alignment(const void *p) {   // as TE's _getAlignment: the largest power of 2 <= 256
  size_t a = 256;
  while (reinterpret_cast<uintptr_t>(p) % a) a /= 2;
  return a;
}

struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
};

static void make_descs(const Gemm &g, Descs &s) {
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT(cublasLtMatrixLayoutCreate(&s.a, in_type(g), g.k, g.m, g.k));
  LT(cublasLtMatrixLayoutCreate(&s.b, in_type(g), g.k, g.n, g.k));
  LT(cublasLtMatrixLayoutCreate(&s.d, CUDA_R_16BF, g.m, g.n, g.m));
  LT(cublasLtMatmulDescCreate(&s.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.fp8) {
    int8_t fast = 1;
    LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.scale,
                                      sizeof(g.scale)));
    LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.scale,
                                      sizeof(g.scale)));
    cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  }
  LT(cublasLtMatrixLayoutCreate(&s.c, CUDA_R_16BF, g.m, g.n, g.m));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  LT(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  size_t ws = kWorkspace - 256;   // TE aligns the workspace to 256 B and shortens it
  LT(cublasLtMatmulPreferenceCreate(&s.pref));
  LT(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof(ws)));
  uint32_t al[4] = {(uint32_t)alignment(g.A), (uint32_t)alignment(g.B), (uint32_t)alignment(g.D),
                    (uint32_t)alignment(g.D)};
  LT(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                          &al[0], sizeof(al[0])));
  LT(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                          &al[1], sizeof(al[1])));
  LT(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                          &al[2], sizeof(al[2])));
  LT(cublasLtMatmulPreferenceSetAttribute(s.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                          &al[3], sizeof(al[3])));
}

static void free_descs(Descs &s) {
  LT(cublasLtMatmulPreferenceDestroy(s.pref));
  LT(cublasLtMatrixLayoutDestroy(s.d));
  LT(cublasLtMatrixLayoutDestroy(s.c));
  LT(cublasLtMatrixLayoutDestroy(s.b));
  LT(cublasLtMatrixLayoutDestroy(s.a));
  LT(cublasLtMatmulDescDestroy(s.op));
}

static cublasLtMatmulAlgo_t heuristic(cublasLtHandle_t h, const Descs &s) {
  cublasLtMatmulHeuristicResult_t r = {};
  int got = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(h, s.op, s.a, s.b, s.c, s.d, s.pref, 1, &r, &got));
  if (!got) { std::fprintf(stderr, "no algorithm\n"); std::exit(1); }
  return r.algo;
}

static void matmul(cublasLtHandle_t h, const Gemm &g, const Descs &s,
                   const cublasLtMatmulAlgo_t &algo, cudaStream_t st) {
  const float one = 1.f, zero = 0.f;
  void *work = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(g.work) + 255) & ~uintptr_t(255));
  LT(cublasLtMatmul(h, s.op, &one, g.A, s.a, g.B, s.b, &zero, g.D, s.c, g.D, s.d, &algo, work,
                    kWorkspace - 256, st));
}

static void te_gemm(cublasLtHandle_t h, const Gemm &g, cudaStream_t st) {   // TE's whole call
  Descs s;
  make_descs(g, s);
  cublasLtMatmulAlgo_t algo = heuristic(h, s);
  matmul(h, g, s, algo, st);
  free_descs(s);
}

static Gemm alloc_gemm(int m, int n, int k, bool fp8, float *scale, void *work) {
  Gemm g{m, n, k, fp8, nullptr, nullptr, nullptr, scale, work};
  size_t e = fp8 ? 1 : 2;
  CK(cudaMalloc(&g.A, (size_t)k * m * e));
  CK(cudaMalloc(&g.B, (size_t)k * n * e));
  CK(cudaMalloc(&g.D, (size_t)m * n * 2));
  CK(cudaMemset(g.A, 0, (size_t)k * m * e));   // zeros: the e4m3 and bf16 zero, no NaN
  CK(cudaMemset(g.B, 0, (size_t)k * n * e));
  return g;
}

static void free_gemm(Gemm &g) { CK(cudaFree(g.A)); CK(cudaFree(g.B)); CK(cudaFree(g.D)); }

int main() {
  cublasLtHandle_t h;
  LT(cublasLtCreate(&h));
  cudaStream_t main_st;
  CK(cudaStreamCreateWithFlags(&main_st, cudaStreamNonBlocking));
  cudaStream_t st[4];
  cudaEvent_t ev[4], t0, t1;
  for (int i = 0; i < 4; ++i) {
    CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
  }
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  float *scale;
  CK(cudaMalloc(&scale, sizeof(float)));
  const float one = 1.f;
  CK(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice));
  std::vector<void *> work(4);
  for (auto &w : work) CK(cudaMalloc(&w, kWorkspace));

  // (m, k): Qwen3-235B-A22B's expert (hidden 4096, expert FFN 1536: fc1 4096 -> 2*1536 with
  // SwiGLU, fc2 1536 -> 4096) and Qwen3-30B-A3B's (hidden 2048, expert FFN 768); n tokens
  struct Shape { const char *name; int m, k; };
  const Shape shapes[] = {{"qwen3_235b_fc1", 3072, 4096}, {"qwen3_235b_fc2", 4096, 1536},
                          {"qwen3_30b_fc1", 1536, 2048}, {"qwen3_30b_fc2", 2048, 768}};
  const int tokens[] = {128, 512, 2048};
  const int reps = 300;

  std::printf("{\"cublasLt_version\": %zu, \"cases\": [\n", cublasLtGetVersion());
  bool first = true;
  for (int f = 0; f < 2; ++f) {
    for (const Shape &sh : shapes) {
      for (int n : tokens) {
        Gemm g = alloc_gemm(sh.m, n, sh.k, f == 1, scale, work[0]);
        for (int w = 0; w < 20; ++w) te_gemm(h, g, main_st);   // warm-up: heuristic cache
        CK(cudaStreamSynchronize(main_st));
        // (a) TE's whole sequence: host issue time, then wall time to the last GEMM's end
        auto c0 = Clock::now();
        for (int r = 0; r < reps; ++r) te_gemm(h, g, main_st);
        double te_issue = us_since(c0) / reps;
        CK(cudaStreamSynchronize(main_st));
        double te_wall = us_since(c0) / reps;
        // (b) the heuristic alone, (c) the matmul alone, descriptors and algorithm kept
        Descs s;
        make_descs(g, s);
        cublasLtMatmulAlgo_t algo = heuristic(h, s);
        c0 = Clock::now();
        for (int r = 0; r < reps; ++r) algo = heuristic(h, s);
        double heur = us_since(c0) / reps;
        c0 = Clock::now();
        for (int r = 0; r < reps; ++r) {
          Descs x;
          make_descs(g, x);
          free_descs(x);
        }
        double descs = us_since(c0) / reps;
        CK(cudaStreamSynchronize(main_st));
        c0 = Clock::now();
        for (int r = 0; r < reps; ++r) matmul(h, g, s, algo, main_st);
        double mm_issue = us_since(c0) / reps;
        CK(cudaStreamSynchronize(main_st));
        // device time of one GEMM: events around reps back-to-back launches
        CK(cudaEventRecord(t0, main_st));
        for (int r = 0; r < reps; ++r) matmul(h, g, s, algo, main_st);
        CK(cudaEventRecord(t1, main_st));
        CK(cudaEventSynchronize(t1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, t0, t1));
        double dev = ms * 1e3 / reps;
        free_descs(s);
        free_gemm(g);
        std::printf("%s{\"kind\": \"gemm\", \"shape\": \"%s\", \"dtype\": \"%s\", \"m\": %d, "
                    "\"n\": %d, \"k\": %d, \"te_issue_us\": %.3f, \"te_wall_us\": %.3f, "
                    "\"heuristic_us\": %.3f, \"descriptors_us\": %.3f, \"matmul_issue_us\": %.3f, "
                    "\"device_us\": %.3f}",
                    first ? "" : ",\n", sh.name, f ? "fp8" : "bf16", sh.m, n, sh.k, te_issue,
                    te_wall, heur, descs, mm_issue, dev);
        first = false;
      }
    }
  }

  // GroupedLinear's pass: e experts of n tokens each on 4 streams, TE's events around them
  const int experts[] = {4, 8, 16, 32};
  const int pass_tokens[] = {128, 512, 2048};
  for (int f = 0; f < 2; ++f) {
    for (const Shape &sh : shapes) {
      for (int e : experts) {
        for (int n : pass_tokens) {
          std::vector<Gemm> gs;
          for (int i = 0; i < e; ++i) gs.push_back(alloc_gemm(sh.m, n, sh.k, f == 1, scale,
                                                               work[i % 4]));
          int used = e < 4 ? e : 4;
          auto pass = [&]() {
            CK(cudaEventRecord(ev[0], main_st));
            for (int s = 0; s < used; ++s) CK(cudaStreamWaitEvent(st[s], ev[0], 0));
            for (int i = 0; i < e; ++i) te_gemm(h, gs[i], st[i % 4]);
            for (int s = 0; s < used; ++s) CK(cudaEventRecord(ev[s], st[s]));
            for (int s = 0; s < used; ++s) CK(cudaStreamWaitEvent(main_st, ev[s], 0));
          };
          for (int w = 0; w < 5; ++w) pass();
          CK(cudaStreamSynchronize(main_st));
          const int passes = 40;
          CK(cudaEventRecord(t0, main_st));
          auto c0 = Clock::now();
          for (int p = 0; p < passes; ++p) pass();
          double issue = us_since(c0) / passes;
          CK(cudaEventRecord(t1, main_st));
          CK(cudaEventSynchronize(t1));
          double wall = us_since(c0) / passes;
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, t0, t1));
          // one pass after a synchronisation, as after the dispatcher's token-count sync
          CK(cudaStreamSynchronize(main_st));
          c0 = Clock::now();
          pass();
          CK(cudaStreamSynchronize(main_st));
          double single = us_since(c0);
          for (auto &g : gs) free_gemm(g);
          // the same FLOPs as one GEMM of e*n tokens (the ideal grouped kernel's floor)
          Gemm big = alloc_gemm(sh.m, e * n, sh.k, f == 1, scale, work[0]);
          Descs s;
          make_descs(big, s);
          cublasLtMatmulAlgo_t algo = heuristic(h, s);
          for (int w = 0; w < 5; ++w) matmul(h, big, s, algo, main_st);
          CK(cudaEventRecord(t0, main_st));
          for (int r = 0; r < 50; ++r) matmul(h, big, s, algo, main_st);
          CK(cudaEventRecord(t1, main_st));
          CK(cudaEventSynchronize(t1));
          float one_ms = 0;
          CK(cudaEventElapsedTime(&one_ms, t0, t1));
          free_descs(s);
          free_gemm(big);
          std::printf(",\n{\"kind\": \"pass\", \"shape\": \"%s\", \"dtype\": \"%s\", \"experts\": %d, "
                      "\"n\": %d, \"issue_us\": %.3f, \"wall_us\": %.3f, \"event_us\": %.3f, "
                      "\"single_pass_us\": %.3f, \"one_gemm_us\": %.3f}",
                      sh.name, f ? "fp8" : "bf16", e, n, issue, wall, ms * 1e3 / passes, single,
                      one_ms * 1e3 / 50);
        }
      }
    }
  }
  // an empty-ish launch for scale: cudaEventRecord's host time
  auto c0 = Clock::now();
  for (int r = 0; r < 1000; ++r) CK(cudaEventRecord(ev[0], main_st));
  double rec = us_since(c0) / 1000;
  CK(cudaStreamSynchronize(main_st));
  std::printf("\n], \"event_record_us\": %.3f}\n", rec);
  return 0;
}
