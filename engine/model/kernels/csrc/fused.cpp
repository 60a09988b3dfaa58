// The small ops around a Llama layer's linear layers, fused as a serving engine fuses them (vLLM's
// CPU ops do the same): RMSNorm with the residual add, rotary embedding in place, SiLU x mul, the
// paged-KV write and decode attention read straight from the blocks (no gathered copy). Each is
// one op over every token row of a forward, so a layer is ~10 op calls instead of ~60 small
// torch ops, and each has a plain-torch reference in engine/kernels/__init__.py.
//
// Plain loops the compiler vectorises, cloned per instruction set (GCC's target_clones: an
// AVX-512, an AVX2 and a baseline copy of each, the CPU's picked when the library loads), with
// -ffp-contract=off (engine/kernels/build.py) so a*b+c rounds as torch's separate ops do. Two
// things the compiler will not vectorise without reordering sums or calling a vector libm, and
// that a decode step does for every position of every request: the query·key dot products and
// exp (softmax, SiLU). Those have AVX-512 and AVX2 paths written out (the dot products summed in
// 16 or 8 lanes, exp as 2^n · a degree-6 polynomial, within 2 ulp of expf), picked at run time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

#define FT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define FT_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma")))
#define FT_AVX2 __attribute__((target("avx2,fma")))

enum class Isa { kPortable, kAvx2, kAvx512 };

// The widest path this CPU runs, or a lower one FIRST_TOKEN_ISA asks for (engine/kernels: the
// same variable picks the 4-bit kernel's path; tests run every path so).
Isa isa() {
  static const Isa found = [] {
    __builtin_cpu_init();
    const char* want = std::getenv("FIRST_TOKEN_ISA");
    const Isa cap = !want ? Isa::kAvx512 : std::string(want) == "avx2" ? Isa::kAvx2
                  : std::string(want) == "portable" ? Isa::kPortable : Isa::kAvx512;
    Isa best = Isa::kPortable;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) best = Isa::kAvx512;
    return std::min(best, cap);
  }();
  return found;
}

// e^x: x = n ln2 + r (Cody and Waite's two-part ln2), e^r by its Taylor polynomial to degree 6
// (|r| <= ln2/2: the first term left out is under 4e-8 relative), times 2^n.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpC[7] = {1.f, 1.f, 0.5f, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720};

FT_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpC[6]);
  for (int i = 5; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpC[i]));
  return _mm512_scalef_ps(p, n);
}

FT_AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpC[6]);
  for (int i = 5; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpC[i]));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2));
}

// In place: x[i] = e^(x[i] - top); returns their sum.
FT_AVX512 float exp_shift_512(float* x, int64_t n, float top) {
  __m512 sum = _mm512_setzero_ps();
  const __m512 t = _mm512_set1_ps(top);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), t));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), t));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
  }
  return _mm512_reduce_add_ps(sum);
}

FT_AVX2 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

FT_AVX2 float exp_shift_256(float* x, int64_t n, float top) {
  __m256 sum = _mm256_setzero_ps();
  const __m256 t = _mm256_set1_ps(top);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), t));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum256(sum);
  for (; i < n; ++i) total += x[i] = std::exp(x[i] - top);
  return total;
}

FT_CLONES void norm_row(const float* h, const float* w, float eps, int64_t n, float* out) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += h[i] * h[i];
  const float inv = 1.f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (h[i] * inv);
}

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
              what, " must be a contiguous 2-D fp32 CPU tensor");
}

// RMSNorm of every row: w * h / sqrt(mean(h^2) + eps) (transformers' LlamaRMSNorm).
at::Tensor rms_norm(const at::Tensor& h, const at::Tensor& w, double eps) {
  check_rows(h, "rms_norm: h");
  TORCH_CHECK(w.numel() == h.size(1) && w.is_contiguous(), "rms_norm: w must have one weight per column");
  at::Tensor out = at::empty_like(h);
  const int64_t n = h.size(1);
  for (int64_t t = 0; t < h.size(0); ++t)
    norm_row(h.data_ptr<float>() + t * n, w.data_ptr<float>(), float(eps), n, out.data_ptr<float>() + t * n);
  return out;
}

// residual += x (in place: the layer's running hidden state), then RMSNorm of the sum.
at::Tensor add_rms_norm(at::Tensor residual, const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(residual, "add_rms_norm: residual");
  check_rows(x, "add_rms_norm: x");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_rms_norm: x and residual differ in shape");
  residual.add_(x);
  return rms_norm(residual, w, eps);
}

// Rotary embedding in place on the first `heads` heads of every row of qkv [T, (q + 2kv) * d]
// (the queries, then the keys): transformers' rotate_half form, x1*cos - x2*sin, x2*cos + x1*sin
// on the two halves of each head, cos/sin [positions, d/2] from the model's own rotary module.
FT_CLONES void rotate_row(float* x, const float* c, const float* s, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* a = x + h * d;
    float* b = a + half;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = a[i], x2 = b[i];
      a[i] = x1 * c[i] - x2 * s[i];
      b[i] = x2 * c[i] + x1 * s[i];
    }
  }
}

void rotary_(at::Tensor qkv, const at::Tensor& pos, const at::Tensor& cos, const at::Tensor& sin,
             int64_t heads, int64_t head_dim) {
  check_rows(qkv, "rotary_: qkv");
  check_rows(cos, "rotary_: cos");
  check_rows(sin, "rotary_: sin");
  TORCH_CHECK(pos.scalar_type() == at::kLong && pos.numel() == qkv.size(0), "rotary_: one int64 position per row");
  TORCH_CHECK(cos.size(1) * 2 == head_dim && heads * head_dim <= qkv.size(1), "rotary_: shapes disagree");
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < qkv.size(0); ++t) {
    TORCH_CHECK(p[t] >= 0 && p[t] < cos.size(0), "rotary_: position ", p[t], " beyond the table");
    rotate_row(qkv.data_ptr<float>() + t * qkv.size(1), cos.data_ptr<float>() + p[t] * cos.size(1),
               sin.data_ptr<float>() + p[t] * sin.size(1), heads, head_dim);
  }
}

// silu(g) * u for gu [T, 2I] = the gate's outputs then the up projection's.
FT_CLONES void silu_mul_portable(const float* g, const float* u, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

FT_AVX512 void silu_mul_512(const float* g, const float* u, int64_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 sig = _mm512_div_ps(x, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(sig, _mm512_loadu_ps(u + i)));
  }
  silu_mul_portable(g + i, u + i, n - i, out + i);
}

FT_AVX2 void silu_mul_256(const float* g, const float* u, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 sig = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
  }
  silu_mul_portable(g + i, u + i, n - i, out + i);
}

void silu_mul_row(const float* g, const float* u, int64_t n, float* out) {
  switch (isa()) {
    case Isa::kAvx512: return silu_mul_512(g, u, n, out);
    case Isa::kAvx2: return silu_mul_256(g, u, n, out);
    default: return silu_mul_portable(g, u, n, out);
  }
}

at::Tensor silu_mul(const at::Tensor& gu) {
  check_rows(gu, "silu_mul: gu");
  const int64_t n = gu.size(1) / 2;
  at::Tensor out = at::empty({gu.size(0), n}, gu.options());
  for (int64_t t = 0; t < gu.size(0); ++t) {
    const float* g = gu.data_ptr<float>() + t * 2 * n;
    silu_mul_row(g, g + n, n, out.data_ptr<float>() + t * n);
  }
  return out;
}

// Keys and values of the given rows of qkv into their slots of the paged store (slot = block *
// block_size + offset; the store is [blocks, block_size, kv_heads, d]).
void kv_write_(at::Tensor k_store, at::Tensor v_store, const at::Tensor& qkv, const at::Tensor& rows,
               const at::Tensor& slots, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  check_rows(qkv, "kv_write_: qkv");
  TORCH_CHECK(k_store.is_contiguous() && v_store.is_contiguous() && k_store.scalar_type() == at::kFloat,
              "kv_write_: the stores must be contiguous fp32");
  TORCH_CHECK(rows.numel() == slots.numel() && rows.scalar_type() == at::kLong && slots.scalar_type() == at::kLong,
              "kv_write_: one int64 slot per row");
  const int64_t width = kv_heads * head_dim, n_slots = k_store.numel() / width;
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i) {
    TORCH_CHECK(s[i] >= 0 && s[i] < n_slots && r[i] >= 0 && r[i] < qkv.size(0), "kv_write_: slot or row out of range");
    const float* src = qkv.data_ptr<float>() + r[i] * qkv.size(1) + q_heads * head_dim;
    std::copy(src, src + width, k_store.data_ptr<float>() + s[i] * width);
    std::copy(src + width, src + 2 * width, v_store.data_ptr<float>() + s[i] * width);
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// One query head over its sequence's first n positions, keys/values read in place from the blocks
// (`kv` points at this head group's d values in slot 0; a slot is `width` floats further).
// A clone per instruction set as a whole, so the inner loops inline and vectorise in each.
FT_CLONES void attend_head(const float* q, const float* k, const float* v, const int64_t* table, int64_t n,
                           int64_t bs, int64_t width, int64_t d, float scale, float* scores, float* out) {
  // block by block: no division per position
  float top = -INFINITY;
  for (int64_t p0 = 0, i = 0; p0 < n; p0 += bs, ++i) {
    const float* kb = k + table[i] * bs * width;
    for (int64_t o = 0; o < std::min(bs, n - p0); ++o) {
      scores[p0 + o] = dot(q, kb + o * width, d) * scale;
      top = std::max(top, scores[p0 + o]);
    }
  }
  float total = 0.f;
  for (int64_t p = 0; p < n; ++p) total += scores[p] = std::exp(scores[p] - top);
  std::fill(out, out + d, 0.f);
  for (int64_t p0 = 0, i = 0; p0 < n; p0 += bs, ++i) {
    const float* vb = v + table[i] * bs * width;
    for (int64_t o = 0; o < std::min(bs, n - p0); ++o) axpy(scores[p0 + o] / total, vb + o * width, out, d);
  }
}

// attend_head with the dot products in vectors: d = 16 * C (AVX-512) or 8 * C (AVX2) values, C
// vectors a key or value row; scores summed across lanes once per position.
template <int C>
FT_AVX512 void attend_head_512(const float* q, const float* k, const float* v, const int64_t* table, int64_t n,
                               int64_t bs, int64_t width, float scale, float* scores, float* out) {
  __m512 qv[C];
  for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  float top = -INFINITY;
  for (int64_t p0 = 0, i = 0; p0 < n; p0 += bs, ++i) {
    const float* kb = k + table[i] * bs * width;
    for (int64_t o = 0; o < std::min(bs, n - p0); ++o) {
      const float* kr = kb + o * width;
      __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
      for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), acc);
      top = std::max(top, scores[p0 + o] = _mm512_reduce_add_ps(acc) * scale);
    }
  }
  const float inv = 1.f / exp_shift_512(scores, n, top);
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t p0 = 0, i = 0; p0 < n; p0 += bs, ++i) {
    const float* vb = v + table[i] * bs * width;
    for (int64_t o = 0; o < std::min(bs, n - p0); ++o) {
      const __m512 w = _mm512_set1_ps(scores[p0 + o]);
      for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vb + o * width + 16 * c), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(acc[c], _mm512_set1_ps(inv)));
}

template <int C>
FT_AVX2 void attend_head_256(const float* q, const float* k, const float* v, const int64_t* table, int64_t n,
                             int64_t bs, int64_t width, float scale, float* scores, float* out) {
  __m256 qv[C];
  for (int c = 0; c < C; ++c) qv[c] = _mm256_loadu_ps(q + 8 * c);
  float top = -INFINITY;
  for (int64_t p0 = 0, i = 0; p0 < n; p0 += bs, ++i) {
    const float* kb = k + table[i] * bs * width;
    for (int64_t o = 0; o < std::min(bs, n - p0); ++o) {
      const float* kr = kb + o * width;
      __m256 acc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kr));
      for (int c = 1; c < C; ++c) acc = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kr + 8 * c), acc);
      top = std::max(top, scores[p0 + o] = hsum256(acc) * scale);
    }
  }
  const float inv = 1.f / exp_shift_256(scores, n, top);
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t p0 = 0, i = 0; p0 < n; p0 += bs, ++i) {
    const float* vb = v + table[i] * bs * width;
    for (int64_t o = 0; o < std::min(bs, n - p0); ++o) {
      const __m256 w = _mm256_set1_ps(scores[p0 + o]);
      for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vb + o * width + 8 * c), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(inv)));
}

using AttendFn = void (*)(const float*, const float*, const float*, const int64_t*, int64_t, int64_t, int64_t,
                          float, float*, float*);

// The vector path for head size d on this CPU, or nullptr (attend_head then).
AttendFn attend_for(int64_t d) {
  if (isa() == Isa::kAvx512 && d % 16 == 0) {
    switch (d / 16) {
      case 1: return attend_head_512<1>;
      case 2: return attend_head_512<2>;
      case 4: return attend_head_512<4>;
      case 8: return attend_head_512<8>;
    }
  }
  if (isa() != Isa::kPortable && d % 8 == 0) {
    switch (d / 8) {
      case 1: return attend_head_256<1>;
      case 2: return attend_head_256<2>;
      case 4: return attend_head_256<4>;
      case 8: return attend_head_256<8>;
      case 16: return attend_head_256<16>;
    }
  }
  return nullptr;
}

// Decode attention: each of the first B rows of qkv is one request's new token; its queries attend
// to the first lengths[b] positions of its sequence, read in place from the blocks its table names
// (softmax(q.k * scale) v, the keys and values of a query head's group: grouped-query attention).
// Work is split over (request, kv head) pairs. Returns [B, q_heads * d].
at::Tensor paged_decode(const at::Tensor& qkv, const at::Tensor& k_store, const at::Tensor& v_store,
                        const at::Tensor& tables, const at::Tensor& lengths, int64_t q_heads, int64_t kv_heads,
                        int64_t head_dim, double scale) {
  check_rows(qkv, "paged_decode: qkv");
  TORCH_CHECK(k_store.dim() == 4 && k_store.is_contiguous() && v_store.is_contiguous(), "paged_decode: stores [blocks, block_size, kv_heads, d]");
  TORCH_CHECK(tables.dim() == 2 && tables.scalar_type() == at::kLong && tables.is_contiguous(), "paged_decode: tables [B, blocks] int64");
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.numel() == tables.size(0), "paged_decode: one length per table");
  const int64_t B = tables.size(0), bs = k_store.size(1), n_blocks = k_store.size(0), group = q_heads / kv_heads;
  const int64_t width = kv_heads * head_dim, d = head_dim;
  at::Tensor out = at::empty({B, q_heads * d}, qkv.options());
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(len[b] > 0 && len[b] <= tables.size(1) * bs, "paged_decode: length ", len[b], " beyond its table");
  const int64_t* tp = tables.data_ptr<int64_t>();
  for (int64_t i = 0; i < tables.numel(); ++i)
    TORCH_CHECK(tp[i] >= 0 && tp[i] < n_blocks, "paged_decode: block id ", tp[i], " out of range");
  const float* kp = k_store.data_ptr<float>();
  const float* vp = v_store.data_ptr<float>();
  const AttendFn fast = attend_for(d);
  at::parallel_for(0, B * kv_heads, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / kv_heads, g = w % kv_heads, n = len[b];
      const int64_t* table = tables.data_ptr<int64_t>() + b * tables.size(1);
      scores.resize(n);
      for (int64_t qh = g * group; qh < (g + 1) * group; ++qh) {
        const float* q = qkv.data_ptr<float>() + b * qkv.size(1) + qh * d;
        float* o = out.data_ptr<float>() + b * q_heads * d + qh * d;
        if (fast) fast(q, kp + g * d, vp + g * d, table, n, bs, width, float(scale), scores.data(), o);
        else attend_head(q, kp + g * d, vp + g * d, table, n, bs, width, d, float(scale), scores.data(), o);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(first_token, m) {
  m.def("rms_norm(Tensor h, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) residual, Tensor x, Tensor w, float eps) -> Tensor");
  m.def("rotary_(Tensor(a!) qkv, Tensor pos, Tensor cos, Tensor sin, int heads, int head_dim) -> ()");
  m.def("silu_mul(Tensor gu) -> Tensor");
  m.def("kv_write_(Tensor(a!) k_store, Tensor(b!) v_store, Tensor qkv, Tensor rows, Tensor slots, int q_heads, int kv_heads, int head_dim) -> ()");
  m.def("paged_decode(Tensor qkv, Tensor k_store, Tensor v_store, Tensor tables, Tensor lengths, int q_heads, int kv_heads, int head_dim, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(first_token, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rotary_", &rotary_);
  m.impl("silu_mul", &silu_mul);
  m.impl("kv_write_", &kv_write_);
  m.impl("paged_decode", &paged_decode);
}
