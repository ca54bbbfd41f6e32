// vpp's CPU attention kernel: fp32, AVX-512, one pass over the keys (online softmax, base 2).
//
// out[h, i] = softmax_j(q[h, i] . k[h / g, j] * scale) v[h / g, j] over the keys j <= i + offset
// (offset = Lk - Lq: a chunk after a cached prefix, bottom-right causal; offset >= Lk: every key;
// offset = 0 with Lq == Lk: a square causal piece), and lse[h, i] = log sum_j exp(q . k * scale).
// Grouped-query heads (g = Hq / Hk) are handled natively: the g query heads of a key head share
// each packed key block, so K and V are read once per query block whatever g is.
//
// Layout of the work: a work item is (key head, block of query positions: ROWS rows over the grouped
// heads, so each packed key block serves >= 256 rows whatever g is); its key range ends
// at the last key its last query sees (the fully masked blocks are never touched). Per key block
// of BK keys, K is packed transposed ([D, BK] in panels of 64 keys; every head's K^T once per call
// where that takes <= PACK_ONCE_BYTES, else per work item) and, per tile of R <= 6 query rows, the scores
// S = Q K^T (Q pre-scaled by scale * log2 e) land in a small buffer, the softmax update runs on it
// in place (exp2 by a degree-7 polynomial and scalef, a few ulp), and O += P V accumulates into
// the output rows (fp32). Work items are shared out over ``threads`` pthreads.
//
// Built at first use by vpp/transformer/attention/cpu_kernel.py (g++ -O3, with the AVX-512 target
// set per function) and called through ctypes; used only on CPUs with AVX-512F.

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define TGT __attribute__((target("avx512f,avx512dq,fma")))

namespace {

constexpr int ROWS = 256;  // query rows (positions x grouped heads) per work item, at least
constexpr int BK = 512;   // keys per packed block
constexpr int RMAX = 6;   // query rows per register tile
constexpr int64_t PACK_ONCE_BYTES = 64 << 20;  // K^T packed once per call up to this size
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

struct Args {
  const float *q, *k, *v;
  float *out, *lse;
  int64_t hq, hk, lq, lk, d, dv;
  int64_t q_sh, q_sl, k_sh, k_sl, v_sh, v_sl;
  int64_t o_sh, o_sl;  // the output's strides (floats): head, position (its rows contiguous)
  int64_t offset;
  float scale;
  int64_t bq, items, nq;  // query positions per work item, work items, query blocks per head
  const float* kt_all;    // every head's K^T packed once per call (panels of 64 keys), or null
  int64_t kt_ld;          // keys per head in kt_all (lk rounded up to 64)
  int threads;
};

TGT inline __m512 exp2_ps(__m512 x) {
  // 2^x for x <= 0 (and -inf): n = round(x), f = x - n in [-0.5, 0.5], 2^f by Taylor to degree 7.
  // The clamp keeps a NaN (maxps returns its second operand when either is NaN): a NaN score makes a
  // NaN output, as in torch's kernels, so the stage's finite check still sees it.
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-05f);                 // ln2^7 / 7!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));  // ln2^6 / 6!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));  // ln2^5 / 5!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));  // ln2^4 / 4!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));  // ln2^3 / 3!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));  // ln2^2 / 2!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));  // ln2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// S[r][0:ncols) = Qs[r] . KT[:, c] for R rows, and each row's running maximum as a vector (mx[r]);
// KT is packed in column panels of 64: panel c0 / 64 is [d, 64] (contiguous), ncols <= the panels' width.
template <int R>
TGT void scores(const float* qs, int64_t d, const float* kt, int64_t ncols, int64_t lds, float* s, __m512* mx) {
  for (int64_t c0 = 0; c0 < ncols; c0 += 64) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
    const float* panel = kt + c0 * d;
    for (int64_t dd = 0; dd < d; ++dd) {
      const float* row = panel + dd * 64;
      __m512 b0 = _mm512_loadu_ps(row), b1 = _mm512_loadu_ps(row + 16);
      __m512 b2 = _mm512_loadu_ps(row + 32), b3 = _mm512_loadu_ps(row + 48);
      for (int r = 0; r < R; ++r) {
        __m512 a = _mm512_set1_ps(qs[r * d + dd]);
        acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(a, b2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(a, b3, acc[r][3]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(s + r * lds + c0 + 16 * u, acc[r][u]);
      // columns past ncols (zero keys) must not raise the maximum: the caller masks them below
      if (c0 + 64 <= ncols)
        mx[r] = _mm512_max_ps(mx[r], _mm512_max_ps(_mm512_max_ps(acc[r][0], acc[r][1]),
                                                   _mm512_max_ps(acc[r][2], acc[r][3])));
    }
  }
}

// O[r][c0:c0+16*NV) = alpha[r] * O[r] + P[r][0:n) V[0:n, c0:c0+16*NV) for R rows.
template <int R, int NV>
TGT void accumulate(float* const* o, const float* alpha, const float* p, int64_t ldp, const float* v,
                    int64_t v_sl, int64_t n, int64_t c0) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    __m512 a = _mm512_set1_ps(alpha[r]);
    for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_mul_ps(a, _mm512_loadu_ps(o[r] + c0 + 16 * u));
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = v + j * v_sl + c0;
    __m512 b[NV];
    for (int u = 0; u < NV; ++u) b[u] = _mm512_loadu_ps(vr + 16 * u);
    for (int r = 0; r < R; ++r) {
      __m512 a = _mm512_set1_ps(p[r * ldp + j]);
      for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_fmadd_ps(a, b[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) _mm512_storeu_ps(o[r] + c0 + 16 * u, acc[r][u]);
}

template <int R>
TGT void accumulate_all(float* const* o, const float* alpha, const float* p, int64_t ldp, const float* v,
                        int64_t v_sl, int64_t n, int64_t dv) {
  int64_t c0 = 0;
  for (; c0 + 64 <= dv; c0 += 64) accumulate<R, 4>(o, alpha, p, ldp, v, v_sl, n, c0);
  switch ((dv - c0) / 16) {
    case 3: accumulate<R, 3>(o, alpha, p, ldp, v, v_sl, n, c0); break;
    case 2: accumulate<R, 2>(o, alpha, p, ldp, v, v_sl, n, c0); break;
    case 1: accumulate<R, 1>(o, alpha, p, ldp, v, v_sl, n, c0); break;
    default: break;
  }
}

// One tile of R query rows against one packed key block: scores, softmax update, P V.
template <int R>
TGT void tile(const Args& a, const float* qs, const int64_t* pos, float* const* o, float* m, float* l,
              const float* kt, int64_t j0, int64_t n, const float* vblk, float* s) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 mx[R];
  for (int r = 0; r < R; ++r) mx[r] = ninf;
  scores<R>(qs, a.d, kt, n, BK, s, mx);
  const int64_t padded = (n + 15) & ~int64_t(15), full = n & ~int64_t(63);
  float bmax[R];
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * BK;
    int64_t visible = pos[r] + a.offset - j0 + 1;  // keys [0, visible) of the block are seen
    if (visible > n) visible = n;
    if (visible < 0) visible = 0;
    if (visible < full) {  // a diagonal block: mask, and take the maximum over what is left
      for (int64_t c = visible; c < padded; ++c) sr[c] = -INFINITY;
      mx[r] = ninf;
      for (int64_t c = 0; c < full; c += 16) mx[r] = _mm512_max_ps(mx[r], _mm512_loadu_ps(sr + c));
    } else {
      for (int64_t c = visible; c < padded; ++c) sr[c] = -INFINITY;
    }
    for (int64_t c = full; c < padded; c += 16) mx[r] = _mm512_max_ps(mx[r], _mm512_loadu_ps(sr + c));
    bmax[r] = _mm512_reduce_max_ps(mx[r]);
  }
  float mold[16], mnew[16], alpha[16];
  for (int r = 0; r < 16; ++r) mold[r] = mnew[r] = 0.0f;
  for (int r = 0; r < R; ++r) {
    mold[r] = m[r];
    mnew[r] = m[r] > bmax[r] ? m[r] : bmax[r];
  }
  // every row's rescale factor in one vector exp: 2^(m_old - m_new) (0 where nothing was seen before)
  _mm512_storeu_ps(alpha, exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(mold), _mm512_loadu_ps(mnew))));
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * BK;
    if (mnew[r] == -INFINITY) {  // nothing seen yet: this row's block contributes nothing
      alpha[r] = 1.0f;
      for (int64_t c = 0; c < padded; c += 16) _mm512_storeu_ps(sr + c, _mm512_setzero_ps());
      continue;
    }
    if (mold[r] == -INFINITY) alpha[r] = 0.0f;
    __m512 mv = _mm512_set1_ps(mnew[r]), sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= padded; c += 32) {
      __m512 e0 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(sr + c), mv));
      __m512 e1 = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(sr + c + 16), mv));
      _mm512_storeu_ps(sr + c, e0);
      _mm512_storeu_ps(sr + c + 16, e1);
      sum0 = _mm512_add_ps(sum0, e0);
      sum1 = _mm512_add_ps(sum1, e1);
    }
    for (; c < padded; c += 16) {
      __m512 e = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(sr + c), mv));
      _mm512_storeu_ps(sr + c, e);
      sum0 = _mm512_add_ps(sum0, e);
    }
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
    m[r] = mnew[r];
  }
  accumulate_all<R>(o, alpha, s, BK, vblk, a.v_sl, n, a.dv);
}

TGT void tile_any(int rows, const Args& a, const float* qs, const int64_t* pos, float* const* o, float* m,
                  float* l, const float* kt, int64_t j0, int64_t n, const float* vblk, float* s) {
  switch (rows) {
    case 6: tile<6>(a, qs, pos, o, m, l, kt, j0, n, vblk, s); break;
    case 5: tile<5>(a, qs, pos, o, m, l, kt, j0, n, vblk, s); break;
    case 4: tile<4>(a, qs, pos, o, m, l, kt, j0, n, vblk, s); break;
    case 3: tile<3>(a, qs, pos, o, m, l, kt, j0, n, vblk, s); break;
    case 2: tile<2>(a, qs, pos, o, m, l, kt, j0, n, vblk, s); break;
    default: tile<1>(a, qs, pos, o, m, l, kt, j0, n, vblk, s); break;
  }
}

// K^T of n keys (rows k_sl floats apart) in panels of 64 keys: panel i is [d, 64], key 64 i + c at
// column c; columns past n (up to the next multiple of 64) are zero.
void pack_panels(const float* k, int64_t k_sl, int64_t d, int64_t n, float* dst) {
  const int64_t ldk = (n + 63) & ~int64_t(63);
  for (int64_t j = 0; j < ldk; ++j) {
    float* col = dst + (j / 64) * 64 * d + (j % 64);
    const float* src = k + j * k_sl;
    if (j < n)
      for (int64_t dd = 0; dd < d; ++dd) col[dd * 64] = src[dd];
    else
      for (int64_t dd = 0; dd < d; ++dd) col[dd * 64] = 0.0f;
  }
}

struct Scratch {
  float *qs, *kt, *s, *m, *l;
};

TGT void work_item(const Args& a, int64_t item, Scratch& w) {
  const int64_t g = a.hq / a.hk;
  const int64_t h = item / a.nq, p0 = (item % a.nq) * a.bq;
  const int64_t p1 = p0 + a.bq < a.lq ? p0 + a.bq : a.lq, np = p1 - p0;
  const float qscale = a.scale * LOG2E;
  // pack the block's query rows, pre-scaled: row (head u of the group, position p) at (u * np + p - p0)
  for (int64_t u = 0; u < g; ++u)
    for (int64_t p = p0; p < p1; ++p) {
      const float* src = a.q + (h * g + u) * a.q_sh + p * a.q_sl;
      float* dst = w.qs + (u * np + p - p0) * a.d;
      for (int64_t dd = 0; dd < a.d; ++dd) dst[dd] = src[dd] * qscale;
    }
  const int64_t rows = g * np;
  for (int64_t r = 0; r < rows; ++r) {
    w.m[r] = -INFINITY;
    w.l[r] = 0.0f;
    const int64_t u = r / np, p = p0 + r % np;
    memset(a.out + (h * g + u) * a.o_sh + p * a.o_sl, 0, sizeof(float) * a.dv);
  }
  int64_t kend = p1 - 1 + a.offset + 1;  // keys the last position sees
  if (kend > a.lk) kend = a.lk;
  const float* kh = a.k + h * a.k_sh;
  const float* vh = a.v + h * a.v_sh;
  for (int64_t j0 = 0; j0 < kend; j0 += BK) {
    const int64_t n = j0 + BK < kend ? BK : kend - j0;
    const float* kt = w.kt;
    if (a.kt_all != nullptr)  // packed once for the call: this block's panels start at key j0
      kt = a.kt_all + h * a.d * a.kt_ld + j0 * a.d;
    else
      pack_panels(kh + j0 * a.k_sl, a.k_sl, a.d, n, w.kt);
    const float* vblk = vh + j0 * a.v_sl;
    // tiles of RMAX consecutive packed rows (row u * np + p - p0: head u of the group, position p), so a
    // tile spans heads where a work item has few positions (a decode step: one position, g heads)
    for (int64_t r0 = 0; r0 < rows; r0 += RMAX) {
      const int rt = (int)(rows - r0 < RMAX ? rows - r0 : RMAX);
      int64_t pos[RMAX], last = -1;
      float* o[RMAX];
      for (int r = 0; r < rt; ++r) {
        const int64_t u = (r0 + r) / np;
        pos[r] = p0 + (r0 + r) % np;
        o[r] = a.out + (h * g + u) * a.o_sh + pos[r] * a.o_sl;
        if (pos[r] > last) last = pos[r];
      }
      if (j0 > last + a.offset) continue;  // every key of the block is after these rows
      tile_any(rt, a, w.qs + r0 * a.d, pos, o, w.m + r0, w.l + r0, kt, j0, n, vblk, w.s);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t u = r / np, p = p0 + r % np;
    float* o = a.out + (h * g + u) * a.o_sh + p * a.o_sl;
    const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;
    for (int64_t c = 0; c < a.dv; ++c) o[c] *= inv;
    a.lse[(h * g + u) * a.lq + p] = w.l[r] > 0.0f ? (w.m[r] + log2f(w.l[r])) * LN2 : -INFINITY;
  }
}

struct Job {
  const Args* a;
  int index;
};

void* worker(void* arg) {
  const Job* job = static_cast<const Job*>(arg);
  const Args& a = *job->a;
  const int64_t g = a.hq / a.hk;
  Scratch w;
  w.qs = static_cast<float*>(aligned_alloc(64, sizeof(float) * ((g * a.bq * a.d + 15) & ~int64_t(15))));
  w.kt = static_cast<float*>(aligned_alloc(64, sizeof(float) * a.d * BK));
  w.s = static_cast<float*>(aligned_alloc(64, sizeof(float) * RMAX * BK));
  w.m = static_cast<float*>(malloc(sizeof(float) * g * a.bq));
  w.l = static_cast<float*>(malloc(sizeof(float) * g * a.bq));
  // interleaved items: the causal ones grow along the query axis, so neighbours share the work
  for (int64_t item = job->index; item < a.items; item += a.threads) work_item(a, item, w);
  free(w.qs); free(w.kt); free(w.s); free(w.m); free(w.l);
  return nullptr;
}

int run_items(Args& a) {
  if (a.threads == 1) {
    Job job{&a, 0};
    worker(&job);
    return 0;
  }
  pthread_t tids[256];
  Job jobs[256];
  if (a.threads > 256) a.threads = 256;
  int started = 0;
  for (int t = 1; t < a.threads; ++t) {
    jobs[t] = Job{&a, t};
    if (pthread_create(&tids[t], nullptr, worker, &jobs[t]) != 0) break;
    ++started;
  }
  if (started != a.threads - 1) {  // could not start every thread: run the rest here, in one stride
    for (int t = 1; t <= started; ++t) pthread_join(tids[t], nullptr);
    a.threads = 1;
    Job job{&a, 0};
    worker(&job);
    return 0;
  }
  jobs[0] = Job{&a, 0};
  worker(&jobs[0]);
  for (int t = 1; t < a.threads; ++t) pthread_join(tids[t], nullptr);
  return 0;
}

}  // namespace

extern "C" {

int vpp_attn_abi(void) { return 2; }

// 1 where this CPU runs the kernel (AVX-512 F and DQ), else 0: the caller asks before any call.
int vpp_attn_cpu_ok(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}

// Returns 0, or a negative code for arguments the kernel refuses (the caller checks them first).
int vpp_attn_f32(const float* q, const float* k, const float* v, float* out, float* lse, int64_t hq, int64_t hk,
                 int64_t lq, int64_t lk, int64_t d, int64_t dv, int64_t q_sh, int64_t q_sl, int64_t k_sh,
                 int64_t k_sl, int64_t v_sh, int64_t v_sl, int64_t o_sh, int64_t o_sl, int64_t offset, float scale,
                 int threads) {
  if (hk <= 0 || hq % hk || d <= 0 || dv <= 0 || dv % 16 || lq <= 0 || lk <= 0) return -1;
  Args a{q, k, v, out, lse, hq, hk, lq, lk, d, dv, q_sh, q_sl, k_sh, k_sl, v_sh, v_sl, o_sh, o_sl, offset, scale,
         0, 0, 0, nullptr, 0, 1};
  // each packed key block serves at least ROWS query rows: 64 positions of 4 grouped heads, 256 of one
  a.bq = (ROWS / (hq / hk) + RMAX - 1) / RMAX * RMAX;
  if (a.bq < 2 * RMAX) a.bq = 2 * RMAX;
  a.nq = (lq + a.bq - 1) / a.bq;
  a.items = hk * a.nq;
  a.threads = threads < 1 ? 1 : (threads > a.items ? (int)a.items : threads);
  // Several query blocks per head read the same keys: pack every head's K^T once for the call instead
  // of once per work item, where that fits in PACK_ONCE_BYTES (else each work item packs its blocks).
  float* kt_all = nullptr;
  a.kt_ld = (lk + 63) & ~int64_t(63);
  if (a.nq > 1 && hk * d * a.kt_ld * (int64_t)sizeof(float) <= PACK_ONCE_BYTES) {
    kt_all = static_cast<float*>(aligned_alloc(64, sizeof(float) * hk * d * a.kt_ld));
    if (kt_all != nullptr) {
      for (int64_t h = 0; h < hk; ++h) pack_panels(k + h * k_sh, k_sl, d, lk, kt_all + h * d * a.kt_ld);
      a.kt_all = kt_all;
    }
  }
  const int rc = run_items(a);
  free(kt_all);
  return rc;
}

}  // extern "C"
