// y = x · Wᵀ with W kept in ggml's own blocks (Q4_1, Q8_0), x in fp32: a torch custom op.
//
// A block holds 32 consecutive weights of one output row: Q4_1 is {fp16 d, fp16 m, 16 bytes of
// nibbles} (weight j = d·q_j + m, q_j the low nibble of byte j for j < 16, the high nibble of
// byte j-16 after), Q8_0 is {fp16 d, 32 int8} (weight j = d·q_j). Each block is dequantised in
// registers to fp32 (the same real numbers a dequantised copy holds, up to the rounding of d·q+m
// in one fused step) and multiplied into every activation row of a tile, so a weight byte is read
// from memory once per tile of rows and the activations stay fp32 (no int8 rounding of x, unlike
// ggml's vec_dot kernels): the result equals fp32 matmul on the dequantised weights to ~1e-6.
//
// The weights are the file's blocks regrouped per output row (see qs_offset) so that a row's
// scales convert in a few vector instructions. One shared object, compiled with no -march flag:
// each instruction-set path is a function compiled for its own target (GCC's target attribute)
// and the caller picks one at run time from `isas()`, so the same build runs on an AVX2 EPYC, an
// AVX-512 Xeon and anything else (portable).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kQ4_1 = 3, kQ8_0 = 8;      // ggml's type ids, as the GGUF file names them
constexpr int64_t kBlock = 32;                // weights per block
constexpr int64_t kPortable = 0, kAvx2 = 1, kAvx512 = 2;
constexpr int kRows = 4;                      // activation rows multiplied per unpacked block

constexpr int64_t kMaxBlocks = 512;           // blocks per row: K up to 16384

int64_t block_bytes(int64_t type) {
  return type == kQ4_1 ? 20 : type == kQ8_0 ? 34 : 0;
}

// The repacked row (the same bytes as the file's blocks, regrouped): every block's fp16 d, then
// (Q4_1) every block's fp16 m, then every block's quants.
int64_t qs_offset(int64_t type, int64_t nb) {
  return (type == kQ4_1 ? 4 : 2) * nb;
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// IEEE half -> float without F16C (the portable path).
float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
  if (exp == 0 && man == 0) {
    bits = sign;
  } else if (exp == 0) {                      // subnormal: normalise the mantissa
    exp = 113;
    while (!(man & 0x400u)) { man <<= 1; --exp; }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A row's scales (and Q4_1 minimums) as fp32, converted once per row: the blocks' loop then
// broadcasts them from memory, which costs a load, not the shuffle port that converting one
// fp16 at a time in the loop would saturate (measured: 1.8x slower per block, hot, one thread).
struct RowScales {
  float dm[2 * kMaxBlocks + 8];
  const float* d = dm;
  const float* m = dm;                        // dm + nb once converted (Q4_1)
};

void scales_portable(int64_t type, const uint8_t* row, int64_t nb, RowScales& s) {
  for (int64_t i = 0; i < (type == kQ4_1 ? 2 * nb : nb); ++i) s.dm[i] = half_to_float(load_u16(row + 2 * i));
  s.m = s.dm + nb;
}

// ---- portable: one weight at a time ----------------------------------------------------------
template <int R>
void dot_portable(int64_t type, const uint8_t* row, const float* x, int64_t K, float* out) {
  const int64_t nb = K / kBlock;
  RowScales s;
  scales_portable(type, row, nb, s);
  const uint8_t* qs = row + qs_offset(type, nb);
  float acc[R] = {};
  for (int64_t b = 0; b < nb; ++b) {
    float wf[kBlock];
    if (type == kQ4_1) {
      const uint8_t* q = qs + 16 * b;
      for (int j = 0; j < 16; ++j) {
        wf[j] = s.d[b] * float(q[j] & 0x0f) + s.m[b];
        wf[j + 16] = s.d[b] * float(q[j] >> 4) + s.m[b];
      }
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(qs + kBlock * b);
      for (int j = 0; j < kBlock; ++j) wf[j] = s.d[b] * float(q[j]);
    }
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * K + b * kBlock;
      for (int j = 0; j < kBlock; ++j) acc[r] += wf[j] * xr[j];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// ---- AVX2 + FMA + F16C: a block is four vectors of 8 -----------------------------------------
#define FT_AVX2 __attribute__((target("avx2,fma,f16c")))

FT_AVX2 void scales_avx2(int64_t type, const uint8_t* row, int64_t nb, RowScales& s) {
  // d and m are adjacent fp16 runs at the row's start; a last group of 8 may read a few bytes of
  // the quants that follow (inside the row) into slots nobody reads.
  const int64_t n = type == kQ4_1 ? 2 * nb : nb;
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(s.dm + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i))));
  s.m = s.dm + nb;
}

FT_AVX2 inline void unpack_avx2(int64_t type, const uint8_t* qs, const RowScales& s, int64_t b, __m256 q[4]) {
  const __m256 d = _mm256_broadcast_ss(s.d + b);
  if (type == kQ4_1) {
    const __m256 m = _mm256_broadcast_ss(s.m + b);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * b));
    const __m128i nib = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, nib), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), nib);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i])), d, m);
  } else {
    for (int i = 0; i < 4; ++i) {
      const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + kBlock * b + 8 * i));
      q[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)), d);
    }
  }
}

FT_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R>
FT_AVX2 void dot_avx2(int64_t type, const uint8_t* row, const float* x, int64_t K, float* out) {
  const int64_t nb = K / kBlock;
  RowScales s;
  scales_avx2(type, row, nb, s);
  const uint8_t* qs = row + qs_offset(type, nb);
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256 q[4];
    unpack_avx2(type, qs, s, b, q);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * K + b * kBlock;
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_fmadd_ps(q[i], _mm256_loadu_ps(xr + 8 * i), acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = hsum_avx2(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
}

// ---- AVX-512: a block is two vectors of 16; two blocks per iteration, four chains per row ----
#define FT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

FT_AVX512 inline void unpack_avx512(int64_t type, const uint8_t* qs, const RowScales& s, int64_t b, __m512& lo, __m512& hi) {
  const __m512 d = _mm512_set1_ps(s.d[b]);
  if (type == kQ4_1) {
    const __m512 m = _mm512_set1_ps(s.m[b]);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * b));
    const __m128i nib = _mm_set1_epi8(0x0f);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, nib))), d, m);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), nib))), d, m);
  } else {
    const uint8_t* q = qs + kBlock * b;
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))), d);
  }
}

template <int R>
FT_AVX512 void dot_avx512(int64_t type, const uint8_t* row, const float* x, int64_t K, float* out) {
  const int64_t nb = K / kBlock;
  RowScales s;
  scales_avx2(type, row, nb, s);
  const uint8_t* qs = row + qs_offset(type, nb);
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    __m512 q[4];
    unpack_avx512(type, qs, s, b, q[0], q[1]);
    unpack_avx512(type, qs, s, b + 1, q[2], q[3]);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * K + b * kBlock;
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_fmadd_ps(q[i], _mm512_loadu_ps(xr + 16 * i), acc[r][i]);
    }
  }
  if (b < nb) {                               // an odd block count: the last one alone
    __m512 lo, hi;
    unpack_avx512(type, qs, s, b, lo, hi);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * K + b * kBlock;
      acc[r][0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xr), acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xr + 16), acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3])));
}

// ---- the driver: output rows split over threads, weights read once per tile of rows ----------
using Dot = void (*)(int64_t, const uint8_t*, const float*, int64_t, float*);

template <template <int> class Path>
Dot dot_for(int rows) {
  switch (rows) {
    case 1: return Path<1>::fn;
    case 2: return Path<2>::fn;
    case 3: return Path<3>::fn;
    default: return Path<4>::fn;
  }
}
template <int R> struct Portable { static constexpr Dot fn = dot_portable<R>; };
template <int R> struct Avx2 { static constexpr Dot fn = dot_avx2<R>; };
template <int R> struct Avx512 { static constexpr Dot fn = dot_avx512<R>; };

Dot pick(int64_t isa, int rows) {
  if (isa == kAvx512) return dot_for<Avx512>(rows);
  if (isa == kAvx2) return dot_for<Avx2>(rows);
  return dot_for<Portable>(rows);
}

bool supported(int64_t isa) {
  __builtin_cpu_init();
  if (isa == kAvx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && supported(kAvx2);
  if (isa == kAvx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return isa == kPortable;
}

std::vector<int64_t> isas() {
  std::vector<int64_t> out;
  for (int64_t isa : {kPortable, kAvx2, kAvx512})
    if (supported(isa)) out.push_back(isa);
  return out;
}

// Asks for a later row's bytes ahead of its use: one thread walking rows in order was measured
// at ~8 GB/s cold without it (the hardware prefetcher stops at page boundaries).
constexpr int64_t kAhead = 8;
void prefetch(const uint8_t* p, const uint8_t* end, int64_t bytes) {
  if (p >= end) return;
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 0);
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t isa) {
  const int64_t bytes = block_bytes(type);
  TORCH_CHECK(bytes > 0, "quant_linear: block type ", type, " is not Q4_1 (3) or Q8_0 (8)");
  TORCH_CHECK(supported(isa), "quant_linear: instruction set ", isa, " is not available on this CPU");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "quant_linear: x must be a 2-D fp32 CPU tensor");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(), "quant_linear: w must be contiguous 2-D uint8 blocks");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % kBlock == 0 && K / kBlock <= kMaxBlocks && w.size(1) == K / kBlock * bytes,
              "quant_linear: x has ", K, " columns, w rows hold ", w.size(1), " bytes");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t row_bytes = w.size(1);
  // Output rows are split over the threads; within a thread, a tile of 16 rows' blocks (at most
  // ~16 KB) stays in cache while every tile of activation rows passes over it.
  constexpr int64_t kTile = 16;
  at::parallel_for(0, N, kTile, [&](int64_t n0, int64_t n1) {
    float out[kRows];
    for (int64_t t0 = n0; t0 < n1; t0 += kTile) {
      const int64_t t1 = std::min(n1, t0 + kTile);
      for (int64_t m0 = 0; m0 < M; m0 += kRows) {
        const int rows = int(std::min<int64_t>(kRows, M - m0));
        const Dot dot = pick(isa, rows);
        for (int64_t n = t0; n < t1; ++n) {
          if (m0 == 0) prefetch(wp + (n + kAhead) * row_bytes, wp + n1 * row_bytes, row_bytes);
          dot(type, wp + n * row_bytes, xp + m0 * K, K, out);
          for (int r = 0; r < rows; ++r) yp[(m0 + r) * N + n] = out[r];
        }
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(first_token, m) {
  m.def("quant_linear(Tensor x, Tensor w, int type, int isa) -> Tensor");
  m.def("isas() -> int[]", &isas);
}

TORCH_LIBRARY_IMPL(first_token, CPU, m) {
  m.impl("quant_linear", &quant_linear);
}
