// vpp's fused CPU kernels besides attention: fp32, AVX-512. The MoE's routed experts (below), RMSNorm in
// one pass per row, and the rotary embedding's half rotation (at the end of the file).
//
// The MoE: gather + gate/up GEMM + SiLU x up + down GEMM + weighted scatter-add in one pass over each
// expert's rows, reading the expert weights as they are stored.
//
// For the (token, expert) pairs p sorted by local expert (segment s: pairs [start[s], start[s+1]) of
// expert seg_expert[s]), with x [T, H], gate_up [E, 2I, H] (gate rows, then up rows) and down [E, H, I]:
//   y_p = down[e] (silu(gate[e] x_t) * (up[e] x_t)),   out[t] += weight_p * y_p   (in increasing p)
// which is what MoE's reference computes (index_select, per-expert mm, silu * up, mm, mul, index_add_).
//
// Layout of the work: a work item is a block of at most RB pairs of one expert. Everything runs
// transposed, so the weights are read row-major as stored (no packed copy of them): the block's
// token rows are gathered into X^T [H, RB]; G^T = gate_up[e] X^T [2I, RB], one register tile of 6
// weight rows x 64 pairs at a time (the weight rows stay in L1 across the block's column panels);
// A^T = silu(G^T[:I]) * G^T[I:] [I, RB]; Y^T = down[e] A^T [H, RB]; then each pair's column of Y^T,
// times its weight, is added to its token's output row. With one thread the block adds straight into
// ``out``; with several, each pair's weighted row is written to ``ybuf`` [P, H] and a last pass adds
// every token's rows in increasing p, so the sums are the same whatever the thread count.
//
// Built at first use by vpp/transformer/cpu_ops.py (through vpp/transformer/native.py, as the attention
// kernel is) and called through ctypes; used only on CPUs with AVX-512F.

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define TGT __attribute__((target("avx512f,avx512dq,fma")))

namespace {

constexpr int RB = 128;   // pairs per work item (columns of X^T, G^T, A^T, Y^T)
constexpr int RMAX = 6;   // weight rows per register tile
constexpr float LOG2E = 1.4426950408889634f;

struct Args {
  const float* x;
  int64_t x_sl;
  float* out;
  int64_t out_sl;
  int64_t h, inter;
  const int64_t* tokens;
  const float* weights;
  int64_t pairs;
  const float *gu, *dn;
  int64_t gu_se, gu_sn, dn_se, dn_sn;  // strides: expert, row (the row itself contiguous)
  float* ybuf;                         // [pairs, h] when threads > 1, else null
  const int64_t* item_expert;          // per work item: expert, first pair, pairs
  const int64_t* item_p0;
  const int64_t* item_n;
  int64_t items;
  int threads;
  int* status;  // set to -2 by a thread that could not allocate its scratch
};

TGT inline __m512 exp2_ps(__m512 x) {
  // 2^x: n = round(x), f = x - n in [-0.5, 0.5], 2^f by Taylor to degree 7 (a few ulp), 2^n by scalef
  // (which gives 0 and inf past the range). maxps keeps a NaN (its second operand when either is NaN).
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(150.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-05f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// c[r][0:16 NV) = sum_k a[r][k] b[k][0:16 NV) for R rows a[r] (contiguous over k), b rows ldb apart.
template <int R, int NV>
TGT void tile(const float* const* a, int64_t k, const float* b, int64_t ldb, float* c, int64_t ldc) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* row = b + kk * ldb;
    __m512 bv[NV];
    for (int u = 0; u < NV; ++u) bv[u] = _mm512_loadu_ps(row + 16 * u);
    for (int r = 0; r < R; ++r) {
      __m512 av = _mm512_set1_ps(a[r][kk]);
      for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_fmadd_ps(av, bv[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) _mm512_storeu_ps(c + r * ldc + 16 * u, acc[r][u]);
}

template <int R>
TGT void tile_nv(int nv, const float* const* a, int64_t k, const float* b, int64_t ldb, float* c, int64_t ldc) {
  switch (nv) {
    case 4: tile<R, 4>(a, k, b, ldb, c, ldc); break;
    case 3: tile<R, 3>(a, k, b, ldb, c, ldc); break;
    case 2: tile<R, 2>(a, k, b, ldb, c, ldc); break;
    default: tile<R, 1>(a, k, b, ldb, c, ldc); break;
  }
}

// C [m, cols] (rows ldc apart) = W [m, k] (rows w_sn apart) times B [k, cols], B stored in panels of
// 64 columns ([k, 64] each, contiguous, one after the other); cols a multiple of 16. Weight rows in
// tiles of 6, each tile against every panel (its weight rows stay in L1 across the panels).
TGT void gemm(const float* w, int64_t w_sn, int64_t m, int64_t k, const float* b, int64_t cols, float* c,
              int64_t ldc) {
  for (int64_t r0 = 0; r0 < m; r0 += RMAX) {
    const int rt = (int)(m - r0 < RMAX ? m - r0 : RMAX);
    const float* a[RMAX];
    for (int r = 0; r < rt; ++r) a[r] = w + (r0 + r) * w_sn;
    for (int64_t c0 = 0; c0 < cols; c0 += 64) {
      const int nv = (int)((cols - c0) / 16 < 4 ? (cols - c0) / 16 : 4);
      const float* panel = b + c0 * k;  // panel c0 / 64: [k, 64]
      float* cc = c + r0 * ldc + c0;
      switch (rt) {
        case 6: tile_nv<6>(nv, a, k, panel, 64, cc, ldc); break;
        case 5: tile_nv<5>(nv, a, k, panel, 64, cc, ldc); break;
        case 4: tile_nv<4>(nv, a, k, panel, 64, cc, ldc); break;
        case 3: tile_nv<3>(nv, a, k, panel, 64, cc, ldc); break;
        case 2: tile_nv<2>(nv, a, k, panel, 64, cc, ldc); break;
        default: tile_nv<1>(nv, a, k, panel, 64, cc, ldc); break;
      }
    }
  }
}

// 16 x 16 transpose in registers: r[i] lane j -> r[j] lane i.
TGT inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// X^T [h, ncols] in panels of 64 columns ([h, 64] each): column c = row tokens[c] of x (columns past n
// are zero).
TGT void gather_t(const Args& a, const int64_t* tokens, int64_t n, int64_t ncols, float* xt) {
  const int64_t h16 = a.h & ~int64_t(15);
  for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
    const float* src[16];
    for (int j = 0; j < 16; ++j) src[j] = c0 + j < n ? a.x + tokens[c0 + j] * a.x_sl : nullptr;
    float* panel = xt + (c0 / 64) * a.h * 64 + c0 % 64;
    for (int64_t k0 = 0; k0 < h16; k0 += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j) r[j] = src[j] ? _mm512_loadu_ps(src[j] + k0) : _mm512_setzero_ps();
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_ps(panel + (k0 + j) * 64, r[j]);
    }
    for (int64_t k = h16; k < a.h; ++k)
      for (int j = 0; j < 16; ++j) panel[k * 64 + j] = src[j] ? src[j][k] : 0.0f;
  }
}

// Pair c's weighted output row (column c of Y^T times its weight) added to (one thread) or written as
// (several) its destination row.
TGT void scatter_t(const Args& a, int64_t p0, int64_t n, const float* yt, int64_t ld) {
  const int64_t h16 = a.h & ~int64_t(15);
  for (int64_t c0 = 0; c0 < n; c0 += 16) {
    const int cn = (int)(n - c0 < 16 ? n - c0 : 16);
    float* dst[16];
    __m512 w[16];
    for (int j = 0; j < cn; ++j) {
      const int64_t p = p0 + c0 + j;
      dst[j] = a.ybuf ? a.ybuf + p * a.h : a.out + a.tokens[p] * a.out_sl;
      w[j] = _mm512_set1_ps(a.weights[p]);
    }
    for (int64_t k0 = 0; k0 < h16; k0 += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(yt + (k0 + j) * ld + c0);
      transpose16(r);  // r[j]: pair c0 + j's outputs k0 .. k0 + 15
      for (int j = 0; j < cn; ++j) {
        __m512 v = _mm512_mul_ps(w[j], r[j]);
        if (!a.ybuf) v = _mm512_add_ps(_mm512_loadu_ps(dst[j] + k0), v);
        _mm512_storeu_ps(dst[j] + k0, v);
      }
    }
    for (int64_t k = h16; k < a.h; ++k)
      for (int j = 0; j < cn; ++j) {
        const float v = a.weights[p0 + c0 + j] * yt[k * ld + c0 + j];
        dst[j][k] = a.ybuf ? v : dst[j][k] + v;
      }
  }
}

struct Scratch {
  float *xt, *gt, *at, *yt;
};

TGT void work_item(const Args& a, int64_t item, Scratch& s) {
  const int64_t e = a.item_expert[item], p0 = a.item_p0[item], n = a.item_n[item];
  const int64_t ncols = (n + 15) & ~int64_t(15), I = a.inter;
  gather_t(a, a.tokens + p0, n, ncols, s.xt);
  gemm(a.gu + e * a.gu_se, a.gu_sn, 2 * I, a.h, s.xt, ncols, s.gt, RB);
  const __m512 one = _mm512_set1_ps(1.0f), nlog2e = _mm512_set1_ps(-LOG2E);
  for (int64_t i = 0; i < I; ++i) {
    const float* g = s.gt + i * RB;
    const float* u = s.gt + (I + i) * RB;
    for (int64_t c = 0; c < ncols; c += 16) {  // A^T in panels of 64 columns, as X^T
      __m512 gv = _mm512_loadu_ps(g + c);
      __m512 sig = _mm512_div_ps(gv, _mm512_add_ps(one, exp2_ps(_mm512_mul_ps(gv, nlog2e))));  // silu
      _mm512_storeu_ps(s.at + (c / 64) * I * 64 + i * 64 + c % 64, _mm512_mul_ps(sig, _mm512_loadu_ps(u + c)));
    }
  }
  gemm(a.dn + e * a.dn_se, a.dn_sn, a.h, I, s.at, ncols, s.yt, RB);
  scatter_t(a, p0, n, s.yt, RB);
}

struct Job {
  const Args* a;
  int index;
  int phase;            // 0: work items; 1: every token's rows of ybuf summed into out
  const int64_t* first;  // phase 1: the pairs of token t are by_token[first[t] .. first[t + 1])
  const int64_t* by_token;
  int64_t tokens;
};

void* worker(void* arg) {
  const Job* job = static_cast<const Job*>(arg);
  const Args& a = *job->a;
  if (job->phase == 1) {
    for (int64_t t = job->index; t < job->tokens; t += a.threads) {
      float* o = a.out + t * a.out_sl;
      for (int64_t q = job->first[t]; q < job->first[t + 1]; ++q) {
        const float* y = a.ybuf + job->by_token[q] * a.h;
        for (int64_t k = 0; k < a.h; ++k) o[k] += y[k];
      }
    }
    return nullptr;
  }
  Scratch s;
  const int64_t rows = a.h > 2 * a.inter ? a.h : 2 * a.inter;
  s.xt = static_cast<float*>(aligned_alloc(64, sizeof(float) * a.h * RB));
  s.gt = static_cast<float*>(aligned_alloc(64, sizeof(float) * rows * RB));
  s.at = static_cast<float*>(aligned_alloc(64, sizeof(float) * a.inter * RB));
  s.yt = static_cast<float*>(aligned_alloc(64, sizeof(float) * a.h * RB));
  if (s.xt && s.gt && s.at && s.yt)
    for (int64_t item = job->index; item < a.items; item += a.threads) work_item(a, item, s);
  else
    __atomic_store_n(a.status, -2, __ATOMIC_RELAXED);
  free(s.xt); free(s.gt); free(s.at); free(s.yt);
  return nullptr;
}

// Runs jobs[0 .. a.threads) at once; a job whose thread cannot start runs here, after job 0 (the jobs
// split the work by index, so any of them may run on any thread).
void run_phase(Args& a, Job* jobs) {
  pthread_t tids[256];
  bool started[256];
  for (int t = 1; t < a.threads; ++t) started[t] = pthread_create(&tids[t], nullptr, worker, &jobs[t]) == 0;
  worker(&jobs[0]);
  for (int t = 1; t < a.threads; ++t)
    if (!started[t]) worker(&jobs[t]);
  for (int t = 1; t < a.threads; ++t)
    if (started[t]) pthread_join(tids[t], nullptr);
}

TGT void rms_rows(const float* x, int64_t rows, int64_t n, int64_t x_rs, const float* w, float eps, float* out) {
  const int64_t n16 = n & ~int64_t(15);
  const __mmask16 tail = (__mmask16)((1u << (n - n16)) - 1u);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_rs;
    float* o = out + r * n;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n16; j += 16) {
      __m512 v = _mm512_loadu_ps(xr + j);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    if (tail) {
      __m512 v = _mm512_maskz_loadu_ps(tail, xr + n16);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const float inv = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps);
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t j = 0; j < n16; j += 16)
      _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_loadu_ps(w + j), _mm512_mul_ps(_mm512_loadu_ps(xr + j), iv)));
    if (tail)
      _mm512_mask_storeu_ps(o + n16, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, w + n16),
                                                         _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, xr + n16), iv)));
  }
}

TGT void rope_rows(const float* x, int64_t c, int64_t heads, int64_t d, int64_t x_s0, int64_t x_s1,
                   const float* cos, const float* sin, float* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < c; ++i) {
    const float* cr = cos + i * d;
    const float* sr = sin + i * d;
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = x + i * x_s0 + h * x_s1;
      float* o = out + (i * heads + h) * d;
      for (int64_t j = 0; j < half; j += 16) {
        const __mmask16 m = half - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (half - j)) - 1u);
        __m512 x1 = _mm512_maskz_loadu_ps(m, xr + j), x2 = _mm512_maskz_loadu_ps(m, xr + half + j);
        __m512 lo = _mm512_sub_ps(_mm512_mul_ps(x1, _mm512_maskz_loadu_ps(m, cr + j)),
                                  _mm512_mul_ps(x2, _mm512_maskz_loadu_ps(m, sr + j)));
        __m512 hi = _mm512_add_ps(_mm512_mul_ps(x2, _mm512_maskz_loadu_ps(m, cr + half + j)),
                                  _mm512_mul_ps(x1, _mm512_maskz_loadu_ps(m, sr + half + j)));
        _mm512_mask_storeu_ps(o + j, m, lo);
        _mm512_mask_storeu_ps(o + half + j, m, hi);
      }
    }
  }
}

}  // namespace

extern "C" {

int vpp_moe_abi(void) { return 1; }

int vpp_moe_cpu_ok(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}

// out [T, h] (+)= the experts' weighted outputs; see the top of this file. seg_expert / seg_start:
// ``segments`` local experts and where their pairs start (seg_start[segments] = pairs). ybuf: pairs x h
// floats of scratch, used when threads > 1. Returns 0, -1 for refused arguments, -2 when out of memory
// (then ``out`` is incomplete).
int vpp_moe_f32(const float* x, int64_t x_sl, float* out, int64_t out_sl, int64_t tokens_n, int64_t h,
                int64_t inter, const int64_t* tokens, const float* weights, int64_t pairs,
                const int64_t* seg_expert, const int64_t* seg_start, int64_t segments, const float* gu,
                int64_t gu_se, int64_t gu_sn, const float* dn, int64_t dn_se, int64_t dn_sn, float* ybuf,
                int threads) {
  if (h <= 0 || inter <= 0 || pairs < 0 || segments < 0 || tokens_n < 0) return -1;
  if (pairs == 0) return 0;
  int64_t items = 0;
  for (int64_t s = 0; s < segments; ++s) items += (seg_start[s + 1] - seg_start[s] + RB - 1) / RB;
  int64_t* plan = static_cast<int64_t*>(malloc(sizeof(int64_t) * 3 * (items + 1)));
  if (!plan) return -2;
  int64_t* ie = plan;
  int64_t* ip = plan + items;
  int64_t* in = plan + 2 * items;
  int64_t i = 0;
  for (int64_t s = 0; s < segments; ++s)
    for (int64_t p = seg_start[s]; p < seg_start[s + 1]; p += RB) {
      ie[i] = seg_expert[s];
      ip[i] = p;
      in[i] = seg_start[s + 1] - p < RB ? seg_start[s + 1] - p : RB;
      ++i;
    }
  if (threads > 256) threads = 256;
  if (threads > items) threads = (int)items;
  if (threads < 1 || ybuf == nullptr) threads = 1;
  Args a{x, x_sl, out, out_sl, h, inter, tokens, weights, pairs, gu, dn, gu_se, gu_sn, dn_se, dn_sn,
         threads > 1 ? ybuf : nullptr, ie, ip, in, items, threads, nullptr};
  int rc = 0;
  a.status = &rc;
  if (threads == 1) {
    Job job{&a, 0, 0, nullptr, nullptr, 0};
    worker(&job);
  } else {  // every pair's row into ybuf, then every token's pairs summed in increasing p
    int64_t* first = static_cast<int64_t*>(calloc(tokens_n + 1, sizeof(int64_t)));
    int64_t* by_token = static_cast<int64_t*>(malloc(sizeof(int64_t) * pairs));
    int64_t* fill = static_cast<int64_t*>(malloc(sizeof(int64_t) * (tokens_n + 1)));
    if (!first || !by_token || !fill) {
      rc = -2;
    } else {
      for (int64_t p = 0; p < pairs; ++p) ++first[tokens[p] + 1];  // a counting sort of the pairs by token
      for (int64_t t = 0; t < tokens_n; ++t) first[t + 1] += first[t];
      memcpy(fill, first, sizeof(int64_t) * (tokens_n + 1));
      for (int64_t p = 0; p < pairs; ++p) by_token[fill[tokens[p]]++] = p;
      Job jobs[256];
      for (int t = 0; t < threads; ++t) jobs[t] = Job{&a, t, 0, nullptr, nullptr, 0};
      run_phase(a, jobs);
      for (int t = 0; t < threads; ++t) jobs[t] = Job{&a, t, 1, first, by_token, tokens_n};
      if (rc == 0) run_phase(a, jobs);
    }
    free(first);
    free(by_token);
    free(fill);
  }
  free(plan);
  return rc;
}

// out[r] = w * (x[r] * (1 / sqrt(mean(x[r]^2) + eps))) for the rows r of x (``rows`` rows of n floats,
// x_rs floats apart; out contiguous): Hugging Face's RMSNorm in fp32, in one pass over each row.
int vpp_rms_norm_f32(const float* x, int64_t rows, int64_t n, int64_t x_rs, const float* w, float eps, float* out) {
  if (rows < 0 || n <= 0) return -1;
  rms_rows(x, rows, n, x_rs, w, eps, out);
  return 0;
}

// x [c, heads, d] (strides x_s0, x_s1, 1), cos / sin [c, d] contiguous, d even: out [c, heads, d] contiguous
// = x * cos + cat(-x2, x1) * sin (x1, x2 the halves of the last dim), each product rounded before the
// sum, as the reference computes it.
int vpp_rope_half_f32(const float* x, int64_t c, int64_t heads, int64_t d, int64_t x_s0, int64_t x_s1,
                      const float* cos, const float* sin, float* out) {
  if (c < 0 || heads < 0 || d <= 0 || d % 2) return -1;
  rope_rows(x, c, heads, d, x_s0, x_s1, cos, sin, out);
  return 0;
}

}  // extern "C"
