// y = x · Wᵀ with W kept in ggml's own blocks, x in fp32: a torch custom op.
//
// A file block holds consecutive weights of one output row: Q4_0 {fp16 d, 32 4-bit q} (weight =
// d·(q - 8)), Q4_1 {d, m, 32 4-bit q} (d·q + m), Q5_0 / Q5_1 the same with a fifth bit per weight
// (d·(q - 16), d·q + m), Q8_0 {d, 32 int8} (d·q); the K-quants' super-blocks of 256 (Q4_K / Q5_K:
// fp16 d and dmin, 8 sub-blocks of 32 with 6-bit scales sc and minimums mn, d·sc·q - dmin·mn with
// 4- or 5-bit q; Q6_K: 16 sub-blocks of 16 with int8 scales, d·sc·(q - 32) with 6-bit q); and plain
// F16 / BF16 values, read 32 at a time. engine/model/weights.py regroups the file's blocks 16 output
// rows at a time (a "group"), so that one vector load holds the same weight position of 16 rows
// (llama.cpp's repacked Q4_0_8x8 layout does the same for 8 rows). Per group and file block, first
// the block's own fields, each value's 16 rows side by side: 16 fp16 d, 16 fp16 m (or dmin), the
// K-quants' scales (sc[j][row], one byte each, Q4_K/Q5_K's 6-bit ones unpacked) and minimums; then
// per sub-block of 32 weights its quants:
//   4-, 5- and 6-bit types: four chunks of 16 dwords, chunk c's dword i holding row i's low nibbles
//     of weights 8c..8c+7 (weight 8c+t in bits 4t..4t+3); 5-bit: then 16 dwords of fifth bits, 6-bit:
//     2 x 16 dwords of the top two bits, placed by byte as the nibbles are (byte j of chunk c's
//     dword holds weights 8c+2j and 8c+2j+1; their fifth bits are bits 2c, 2c+1 of byte j of the
//     row's dword, their top bits fields 2(c%2), 2(c%2)+1 of byte j of dword c/2), so that one
//     shift and one mask place a chunk's high bits beside its nibbles, byte by byte;
//   Q8_0: for each of the 32 positions the 16 rows' int8; F16 / BF16: the 16 rows' 2-byte values.
// Q4_1: 320 bytes (16 blocks of 20); Q4_K: 2368 bytes for 16 super-blocks of 144 (the 6-bit scales
// take a byte each here: 3 % more).
//
// The same numbers as the file, regrouped; nothing is rounded again, and a weight is made as the
// `gguf` package's dequantiser makes it: its products are exact in fp32 (a 4-6 bit quant times an
// fp16 scale, times an 8-bit sub-scale), then one rounding where a minimum is added, the rounding of
// an FMA of the same numbers. The product is a GEMM micro-kernel whose weight operand is made in registers: for each position k, the 16 rows'
// weights once (AVX-512: a shift and one VPERMPS lookup of the nibble among {0..15} as floats,
// then d·q + m in one FMA), multiplied into a tile of up to 24 activation rows held in
// accumulators (one FMA per row, the activation broadcast from L1). So a weight is read from
// memory and unpacked once per tile of rows, not once per row, and the activations stay fp32 (no
// int8 rounding of x, unlike ggml's vec_dot): the result equals fp32 matmul on the dequantised
// weights up to summation order. Past one tile of rows (a prompt chunk), each group's weights are
// unpacked once into a small fp32 panel (16 rows x K, in L1/L2) that a plain GEMM micro-kernel
// then reads for every tile: the unpacking is paid once per group, not once per tile, and the
// 538 MB fp32 copy is never read.
//
// The activations are first repacked position-major per tile (x[k][r], as a GEMM packs its A
// operand) so a tile's broadcasts walk one pointer. Threads take tasks (a run of groups for a
// chunk of rows that fits L2) from a shared counter, so a thread the shared machine's scheduler
// holds back leaves its share to the other instead of stalling the call. One shared object,
// compiled with no -march flag: each instruction-set path is compiled for its own target (GCC's
// target attribute) and the caller picks one at run time from `isas()`, so the same build runs on
// an AVX2 EPYC, an AVX-512 Xeon and anything else (portable). Every type has the AVX2 and portable
// paths; AVX-512 ones exist for Q4_1 and Q8_0 only (the others run their AVX2 path on an AVX-512 CPU).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// ggml's type ids, as the GGUF file names them
constexpr int64_t kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13,
                  kQ6_K = 14, kBF16 = 30;
constexpr int64_t kBlock = 32;                // weights per (sub-)block: the unit along a row
constexpr int64_t kGroup = 16;                // output rows regrouped together
constexpr int64_t kPortable = 0, kAvx2 = 1, kAvx512 = 2;

// Where a type's fields lie in a group's block (bytes from its start; engine/model/weights.py
// makes the same layout): qk weights a file block, `bits` a quant, w = scale·(q - offset) or
// scale·q + minimum (`min`), the K-quants' nsc sub-block scales at sc and minimums at mn, then
// qk / 32 sub-blocks of `sub` bytes from `header` on.
struct Layout {
  int64_t qk = 0, bits = 0, offset = 0;
  bool min = false;
  int64_t sc = 0, nsc = 0, mn = 0, header = 0, sub = 0;
};

constexpr Layout layout(int64_t type) {
  Layout L;
  switch (type) {
    case kQ4_0: L.qk = 32, L.bits = 4, L.offset = 8; break;
    case kQ4_1: L.qk = 32, L.bits = 4, L.min = true; break;
    case kQ5_0: L.qk = 32, L.bits = 5, L.offset = 16; break;
    case kQ5_1: L.qk = 32, L.bits = 5, L.min = true; break;
    case kQ8_0: L.qk = 32, L.bits = 8; break;
    case kQ4_K: L.qk = 256, L.bits = 4, L.min = true, L.nsc = 8; break;
    case kQ5_K: L.qk = 256, L.bits = 5, L.min = true, L.nsc = 8; break;
    case kQ6_K: L.qk = 256, L.bits = 6, L.offset = 32, L.nsc = 16; break;
    case kF16: case kBF16: L.qk = 32, L.bits = 16; break;
    default: return L;
  }
  L.header = L.bits == 16 ? 0 : L.min ? 64 : 32;        // d, then m (dmin)
  L.sc = L.header;
  L.header += L.nsc * kGroup;
  L.mn = L.header;
  if (L.min && L.nsc) L.header += 8 * kGroup;
  L.sub = L.bits <= 6 ? 256 + (L.bits - 4) * 64 : 2 * kBlock * L.bits;   // 256 / 320 / 384; 512; 1024
  return L;
}

// Bytes of one group's file block (16 rows' blocks, regrouped); 0: no kernel for the type.
constexpr int64_t group_bytes(int64_t type) {
  const Layout L = layout(type);
  return L.qk ? L.header + L.qk / kBlock * L.sub : 0;
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

// Positions of K per panel (256: 16 KB of fp32 a group, in L1 beside the activations it meets).
constexpr int64_t kPanelK = 256;

// A group's block a few blocks ahead of its use, every cache line of it (one stream per group:
// a tile walks 1-4 groups' blocks side by side).
constexpr int64_t kAheadBlocks = 4;
template <int64_t GB>
inline void prefetch_block(const uint8_t* p) {
  for (int64_t o = 0; o < GB; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
}

// What one tile computes: `rows` activation rows times `groups` groups, written to y.
struct Tile {
  const uint8_t* w;      // the first group's blocks (fused tiles)
  const float* panel;    // ... or that group unpacked: [K][16] fp32 (panel tiles)
  int64_t gstride;       // bytes from one group to the next
  int64_t nb;            // blocks per row (K / 32), or in the panel
  bool add;              // panel tiles: add to y (a later slice of K) instead of storing
  const float* x;        // the tile's activations, position-major: x[k * rows + r]
  const int32_t* xq;     // ... or rounded to int8 (`pack_int8`): four at a time, [block][chunk][even|odd][r]
  const float* xs;       // ... their scales: [block][r] pairs {d, s}; fp32: Σ x, [block][r]
  float* y;              // y[m0][g * 16]
  int64_t N;             // columns of y (its row stride)
  int64_t valid;         // output rows of y from this tile's first group on (the last group may be partial)
};

// ---- portable: one weight at a time, same layout -----------------------------------------------
float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Weight k of sub-block b (K / 32 of them from `g`) of row `lane` of the group at g, computed as
// the gguf package's dequantiser computes it: the same products and the same one rounding.
float weight_portable(int64_t type, const uint8_t* g, int64_t b, int lane, int k) {
  const Layout L = layout(type);
  const int64_t nsub = L.qk / kBlock, j = b % nsub;
  const uint8_t* gb = g + b / nsub * group_bytes(type);
  const uint8_t* sub = gb + L.header + j * L.sub;
  if (type == kF16 || type == kBF16) {
    const uint16_t h = load_u16(sub + 2 * (kGroup * k + lane));
    return type == kF16 ? half_to_float(h) : bf16_to_float(h);
  }
  const float d = half_to_float(load_u16(gb + 2 * lane));
  if (type == kQ8_0) return d * float(int8_t(sub[kGroup * k + lane]));
  uint32_t dw;
  std::memcpy(&dw, sub + 64 * (k / 8) + 4 * lane, 4);
  int q = int((dw >> (4 * (k % 8))) & 0xfu);
  const int c = k / 8, byte = k % 8 / 2, e = k % 2;   // chunk, byte of its dword, which nibble
  if (L.bits == 5) {
    std::memcpy(&dw, sub + 256 + 4 * lane, 4);
    q |= int((dw >> (8 * byte + 2 * c + e)) & 1u) << 4;
  } else if (L.bits == 6) {
    std::memcpy(&dw, sub + 256 + 64 * (c / 2) + 4 * lane, 4);
    q |= int((dw >> (8 * byte + 2 * (2 * (c % 2) + e))) & 3u) << 4;
  }
  float scale = d;
  if (L.nsc == 8) scale = d * float(gb[L.sc + kGroup * j + lane]);
  if (L.nsc == 16) scale = d * float(int8_t(gb[L.sc + kGroup * (2 * j + k / 16) + lane]));
  if (L.offset) return scale * float(q - L.offset);
  const float dq = scale * float(q);       // rounded, then the sum rounded: -ffp-contract=off keeps them apart
  if (!L.min) return dq;
  const float m = half_to_float(load_u16(gb + 32 + 2 * lane));
  return L.nsc ? dq - m * float(gb[L.mn + kGroup * j + lane]) : dq + m;
}

void tile_portable(int64_t type, int rows, int groups, const Tile& t) {
  for (int v = 0; v < groups; ++v) {
    for (int r = 0; r < rows; ++r) {
      float acc[kGroup] = {};
      for (int64_t b = 0; b < t.nb; ++b) {
        const float* xk = t.x + b * kBlock * rows + r;
        for (int lane = 0; lane < kGroup; ++lane)
          for (int k = 0; k < kBlock; ++k) acc[lane] += weight_portable(type, t.w + v * t.gstride, b, lane, k) * xk[k * rows];
      }
      const int64_t valid = std::min<int64_t>(kGroup, t.valid - v * kGroup);
      for (int64_t i = 0; i < valid; ++i) t.y[r * t.N + v * kGroup + i] = acc[i];
    }
  }
}

// ---- AVX2 + FMA + F16C: a group is two vectors of 8 rows ---------------------------------------
#define FT_AVX2 __attribute__((target("avx2,fma,f16c")))

FT_AVX2 inline void store_avx2(const Tile& t, int r, int g, __m256 lo, __m256 hi) {
  float* dst = t.y + r * t.N + g * kGroup;
  const int64_t valid = t.valid - g * kGroup;
  if (valid >= kGroup) {
    _mm256_storeu_ps(dst, lo);
    _mm256_storeu_ps(dst + 8, hi);
    return;
  }
  alignas(32) float tmp[kGroup];         // the last group's valid rows only
  _mm256_store_ps(tmp, lo);
  _mm256_store_ps(tmp + 8, hi);
  std::memcpy(dst, tmp, 4 * valid);
}

// y's partial sums of row r, half h (a panel tile over a later slice of K adds to them).
FT_AVX2 inline __m256 load_avx2(const Tile& t, int r, int h) {
  alignas(32) float tmp[8] = {};
  const int64_t n = std::min<int64_t>(8, t.valid - 8 * h);
  if (n > 0) std::memcpy(tmp, t.y + r * t.N + 8 * h, 4 * n);
  return _mm256_load_ps(tmp);
}

// Group g's scales for block b: two vectors each of d (and m).
template <int64_t TYPE>
FT_AVX2 inline void scales_avx2(const uint8_t* gb, __m256 d[2], __m256 m[2]) {
  for (int h = 0; h < 2; ++h) {
    d[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16 * h)));
    if constexpr (TYPE == kQ4_1)
      m[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 32 + 16 * h)));
  }
}

// Eight unsigned bytes (a K-quant's sub-block scales or minimums of 8 rows) as floats.
FT_AVX2 inline __m256 bytes_avx2(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// One vector of a group's weights (rows 8h..8h+7), position by position: `block` reads sub-block
// b's scales, `chunk` the quants of positions 8c..8c+7, `next` makes the weight of the next position
// as the file's numbers say: w = fma(q, scale, minimum), q an integer (the nibble and any high
// bits), scale = d (times the sub-block's scale in a K-quant: an exact product), minimum = m, or
// -dmin·mn (K), or -offset·scale (Q4_0, Q5_0, Q6_K: exact, and so is scale·q - offset·scale). One
// rounding at most, the one the gguf dequantiser makes; Q8_0 is d·q, F16/BF16 the values.
template <int64_t TYPE>
struct Avx2Weights {
  static constexpr Layout L = layout(TYPE);
  const uint8_t* gb;           // the file block's group
  const uint8_t* sub;          // the sub-block's quants
  int64_t j;                   // which sub-block of the file block
  int h;                       // which 8 rows
  __m256 d, scale, low;
  __m256i raw, high;
  __m256i even, odd;           // 5-, 6-bit: a chunk's quants by byte (byte j: weight 8c+2j, 8c+2j+1)

  FT_AVX2 inline void block(const uint8_t* g, int64_t b, int half) {
    constexpr int64_t nsub = L.qk / kBlock;
    gb = g + b / nsub * group_bytes(TYPE);
    j = b % nsub;
    sub = gb + L.header + j * L.sub;
    h = half;
    if constexpr (L.bits == 16) return;
    d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16 * h)));
    scale = d;
    if constexpr (L.nsc == 8) {
      scale = _mm256_mul_ps(d, bytes_avx2(gb + L.sc + kGroup * j + 8 * h));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 32 + 16 * h)));
      low = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, bytes_avx2(gb + L.mn + kGroup * j + 8 * h)));
    } else if constexpr (L.min) {
      low = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 32 + 16 * h)));
    } else if constexpr (L.offset && L.nsc == 0) {
      low = _mm256_mul_ps(d, _mm256_set1_ps(-float(L.offset)));
    }
  }

  // 5-, 6-bit: a chunk's quants whole, by byte: its nibbles masked (even weights) and shifted
  // (odd), each ORed with its high bits, shifted to bit 4 and masked; `next` then takes byte j
  // of each dword (one shuffle) for weights 8c+2j and 8c+2j+1. Half the instructions of making
  // each weight's five or six bits apart.
  FT_AVX2 inline void chunk(int c) {
    if constexpr (L.bits > 6) return;
    raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 64 * c + 32 * h));
    if constexpr (L.bits == 4) return;
    const __m256i nib = _mm256_set1_epi8(0x0f);
    even = _mm256_and_si256(raw, nib);
    odd = _mm256_and_si256(_mm256_srli_epi32(raw, 4), nib);
    if constexpr (L.bits == 5) {
      if (c == 0) high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 256 + 32 * h));
      const __m256i bit = _mm256_set1_epi8(0x10);         // bits 2c, 2c+1 of each byte, at bit 4
      even = _mm256_or_si256(even, _mm256_and_si256(_mm256_slli_epi32(high, 4), bit));
      odd = _mm256_or_si256(odd, _mm256_and_si256(_mm256_slli_epi32(high, 3), bit));
      high = _mm256_srli_epi32(high, 2);
    } else {
      if (c % 2 == 0) {        // a new sub-block of 16: its top bits and its int8 scale
        high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 256 + 32 * c + 32 * h));
        const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(gb + L.sc + kGroup * (2 * j + c / 2) + 8 * h));
        scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        low = _mm256_mul_ps(scale, _mm256_set1_ps(-float(L.offset)));
      }
      const __m256i bits = _mm256_set1_epi8(0x30);        // fields 2(c%2), 2(c%2)+1 of each byte, at bit 4
      even = _mm256_or_si256(even, _mm256_and_si256(_mm256_slli_epi32(high, 4), bits));
      odd = _mm256_or_si256(odd, _mm256_and_si256(_mm256_slli_epi32(high, 2), bits));
      high = _mm256_srli_epi32(high, 4);
    }
  }

  // The weight at position k (= 8c + s, called in order within a chunk).
  FT_AVX2 inline __m256 next(int k) {
    if constexpr (L.bits == 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + 2 * kGroup * k + 16 * h));
      if constexpr (TYPE == kF16) return _mm256_cvtph_ps(v);
      else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    } else if constexpr (L.bits == 8) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + kGroup * k + 8 * h));
      return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    } else if constexpr (L.bits == 4) {
      const __m256i q = _mm256_and_si256(raw, _mm256_set1_epi32(0xf));
      raw = _mm256_srli_epi32(raw, 4);
      return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), scale, low);
    } else {
      const int b = k % 8 / 2;                             // byte b of each dword, zero-extended
      const __m256i pick = _mm256_setr_epi8(b, -1, -1, -1, 4 + b, -1, -1, -1, 8 + b, -1, -1, -1, 12 + b, -1, -1, -1,
                                            b, -1, -1, -1, 4 + b, -1, -1, -1, 8 + b, -1, -1, -1, 12 + b, -1, -1, -1);
      const __m256i q = _mm256_shuffle_epi8(k % 2 ? odd : even, pick);
      return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), scale, low);
    }
  }
};

// MR activation rows x NV groups (2 * NV vectors) unpacked in registers; 16 registers: MR * NV <= 4.
template <int64_t TYPE, int MR, int NV>
FT_AVX2 void fused_avx2(const Tile& t) {
  constexpr int V = 2 * NV;
  __m256 acc[MR][V] = {};      // zeros
  for (int64_t b = 0; b < t.nb; ++b) {
    Avx2Weights<TYPE> wv[V];
#pragma GCC unroll 32
    for (int v = 0; v < V; ++v) wv[v].block(t.w + (v / 2) * t.gstride, b, v % 2);
    const float* xb = t.x + b * kBlock * MR;
    for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 32
      for (int v = 0; v < V; ++v) wv[v].chunk(c);
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        __m256 w[V];
#pragma GCC unroll 32
        for (int v = 0; v < V; ++v) w[v] = wv[v].next(8 * c + s);
#pragma GCC unroll 32
        for (int r = 0; r < MR; ++r) {
          const __m256 xk = _mm256_broadcast_ss(xb + (8 * c + s) * MR + r);
#pragma GCC unroll 32
          for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(w[v], xk, acc[r][v]);
        }
      }
    }
  }
  for (int g = 0; g < NV; ++g)
    for (int r = 0; r < MR; ++r) store_avx2(t, r, g, acc[r][2 * g], acc[r][2 * g + 1]);
}

// One group unpacked to fp32, position-major: panel[k * 16 + lane].
template <int64_t TYPE>
FT_AVX2 void unpack_avx2(const uint8_t* w, int64_t nb, float* panel) {
  for (int64_t b = 0; b < nb; ++b, panel += kBlock * kGroup) {
    for (int h = 0; h < 2; ++h) {
      Avx2Weights<TYPE> wv;
      wv.block(w, b, h);
      for (int c = 0; c < 4; ++c) {
        wv.chunk(c);
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) _mm256_storeu_ps(panel + (8 * c + s) * kGroup + 8 * h, wv.next(8 * c + s));
      }
    }
  }
}

// MR activation rows x one group read from its fp32 panel; 16 registers: MR <= 6.
template <int MR>
FT_AVX2 void panel_avx2(const Tile& t) {
  __m256 acc[MR][2];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) acc[r][h] = t.add ? load_avx2(t, r, h) : _mm256_setzero_ps();
  const float* w = t.panel;
  const float* x = t.x;
  for (int64_t k = 0; k < t.nb * kBlock; ++k, w += kGroup, x += MR) {
    const __m256 lo = _mm256_loadu_ps(w), hi = _mm256_loadu_ps(w + 8);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m256 xk = _mm256_broadcast_ss(x + r);
      acc[r][0] = _mm256_fmadd_ps(lo, xk, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(hi, xk, acc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) store_avx2(t, r, 0, acc[r][0], acc[r][1]);
}

// ---- AVX-512: a group is one vector of 16 rows -------------------------------------------------
#define FT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

FT_AVX512 inline void store_avx512(const Tile& t, int r, int g, __m512 v) {
  const int64_t valid = t.valid - g * kGroup;
  const __mmask16 keep = valid >= kGroup ? __mmask16(0xffff) : __mmask16((1u << valid) - 1);
  _mm512_mask_storeu_ps(t.y + r * t.N + g * kGroup, keep, v);
}

// The nibble's value as a float by lookup (VPERMPS reads the low 4 bits of each lane's index):
// one instruction in place of a mask and a conversion.
FT_AVX512 inline __m512 levels_avx512() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// MR activation rows x NV groups unpacked in registers; 32 registers: MR * NV accumulators + 3 *
// NV for the groups' scales and quants + the lookup table, so MR <= 24 at NV = 1, MR * NV <= 8 beyond.
// FACTORED (a few rows, MR * NV <= 8, where the FMA pipes wait on unpacking, not on rows): the
// block's scale taken out of the sum, d·Σ q·x + m·Σ x (Σ x per row and block from the packing,
// `t.xs`), so a weight position costs a shift, a lookup and one FMA instead of two: 3 instructions
// for 16 weights, not 4. The same real number; its rounding differs from d·q + m in the last bits
// (tests/engine/test_kernels.py: within 1e-5 of fp32 matmul all the same).
// Weight position k of NV groups (q or d·q + m) into every row's sums (x: that position's MR values).
template <int MR, int NV>
FT_AVX512 inline void into_rows(__m512 (&acc)[MR][NV], const __m512 (&w)[NV], const float* x) {
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    const __m512 xk = _mm512_set1_ps(x[r]);
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(w[v], xk, acc[r][v]);
  }
}

template <int64_t TYPE, int MR, int NV, bool FACTORED>
FT_AVX512 void fused_avx512(const Tile& t) {
  constexpr int64_t GB = group_bytes(TYPE);
  constexpr int OR = FACTORED ? MR : 1, OV = FACTORED ? NV : 1;   // `out` exists only when factored
  __m512 acc[MR][NV], out[OR][OV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 32
  for (int r = 0; r < OR; ++r)
#pragma GCC unroll 32
    for (int v = 0; v < OV; ++v) out[r][v] = _mm512_setzero_ps();
  const __m512 levels = levels_avx512();
  for (int64_t b = 0; b < t.nb; ++b) {
    const uint8_t* gb[NV];
    __m512 d[NV], m[NV];
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      gb[v] = t.w + v * t.gstride + b * GB;
      prefetch_block<GB>(gb[v] + kAheadBlocks * GB);
      d[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb[v])));
      m[v] = TYPE == kQ4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb[v] + 32)))
                           : _mm512_setzero_ps();
    }
    const float* xb = t.x + b * kBlock * MR;
    if constexpr (TYPE == kQ4_1) {
      for (int c = 0; c < 4; ++c) {
        __m512i raw[NV];
#pragma GCC unroll 32
        for (int v = 0; v < NV; ++v) raw[v] = _mm512_loadu_si512(gb[v] + 64 + 64 * c);
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
          __m512 w[NV];
#pragma GCC unroll 32
          for (int v = 0; v < NV; ++v) {
            w[v] = _mm512_permutexvar_ps(raw[v], levels);
            if constexpr (!FACTORED) w[v] = _mm512_fmadd_ps(w[v], d[v], m[v]);
            raw[v] = _mm512_srli_epi32(raw[v], 4);
          }
          into_rows<MR, NV>(acc, w, xb + (8 * c + s) * MR);
        }
      }
    } else {
#pragma GCC unroll 4
      for (int k = 0; k < kBlock; ++k) {
        __m512 w[NV];
#pragma GCC unroll 32
        for (int v = 0; v < NV; ++v) {
          w[v] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb[v] + 32 + 16 * k))));
          if constexpr (!FACTORED) w[v] = _mm512_mul_ps(w[v], d[v]);
        }
        into_rows<MR, NV>(acc, w, xb + k * MR);
      }
    }
    if constexpr (FACTORED) {
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v)
#pragma GCC unroll 32
        for (int r = 0; r < MR; ++r) {
          out[r][v] = _mm512_fmadd_ps(acc[r][v], d[v], out[r][v]);
          if constexpr (TYPE == kQ4_1) out[r][v] = _mm512_fmadd_ps(m[v], _mm512_set1_ps(t.xs[b * MR + r]), out[r][v]);
          acc[r][v] = _mm512_setzero_ps();
        }
    }
  }
  for (int v = 0; v < NV; ++v)
    for (int r = 0; r < MR; ++r) {
      if constexpr (FACTORED) store_avx512(t, r, v, out[r][v]);
      else store_avx512(t, r, v, acc[r][v]);
    }
}

// One group unpacked to fp32, position-major: panel[k * 16 + lane].
template <int64_t TYPE>
FT_AVX512 void unpack_avx512(const uint8_t* w, int64_t nb, float* panel) {
  constexpr int64_t GB = group_bytes(TYPE);
  const __m512 levels = levels_avx512();
  for (int64_t b = 0; b < nb; ++b, panel += kBlock * kGroup) {
    const uint8_t* gb = w + b * GB;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    if constexpr (TYPE == kQ4_1) {
      const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 32)));
      for (int c = 0; c < 4; ++c) {
        __m512i raw = _mm512_loadu_si512(gb + 64 + 64 * c);
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s, raw = _mm512_srli_epi32(raw, 4))
          _mm512_storeu_ps(panel + (8 * c + s) * kGroup, _mm512_fmadd_ps(_mm512_permutexvar_ps(raw, levels), d, m));
      }
    } else {
#pragma GCC unroll 4
      for (int k = 0; k < kBlock; ++k) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 32 + 16 * k));
        _mm512_storeu_ps(panel + k * kGroup, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d));
      }
    }
  }
}

// MR activation rows x NV groups read from their fp32 panels (kPanelK positions each, one after
// the other): NV loads and MR * NV FMAs a position, each broadcast serving NV groups (a GEMM
// micro-kernel's 12 x 32 shape at NV = 2: 24 accumulators).
template <int MR, int NV>
FT_AVX512 void panel_avx512(const Tile& t) {
  __m512 acc[MR][NV];
  __mmask16 keep[NV];
#pragma GCC unroll 32
  for (int v = 0; v < NV; ++v) {
    const int64_t valid = std::clamp<int64_t>(t.valid - v * kGroup, 0, kGroup);
    keep[v] = __mmask16((1u << valid) - 1);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
      acc[r][v] = t.add ? _mm512_maskz_loadu_ps(keep[v], t.y + r * t.N + v * kGroup) : _mm512_setzero_ps();
  }
  const float* w = t.panel;
  const float* x = t.x;
#pragma GCC unroll 2
  for (int64_t k = 0; k < t.nb * kBlock; ++k, w += kGroup, x += MR) {
    __m512 wk[NV];
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) wk[v] = _mm512_loadu_ps(w + v * kPanelK * kGroup);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r]);
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(wk[v], xr, acc[r][v]);
    }
  }
  for (int v = 0; v < NV; ++v)
    for (int r = 0; r < MR; ++r) store_avx512(t, r, v, acc[r][v]);
}

// ---- int8 activations: llama.cpp's arithmetic (the `activations` setting) ----------------------
// x rounded per row and block of 32 as llama.cpp's Q8_1 rounds it: d = max|x| / 127 (kept as fp16),
// q = round(x · 127 / max|x|), s = d·Σq (fp16). A Q4_1 block's dot product is then d_w·d·Σ q_w·q + m_w·s:
// integer multiply-adds (VNNI's VPDPBUSD: 64 u8 x s8 products into 16 int32 lanes an instruction),
// then two FMAs a block. Each dword of the groups' quants holds 8 nibbles; masking it gives the
// bytes of weights 8c, 8c+2, 8c+4, 8c+6 and shifting first 8c+1, +3, +5, +7, so x is repacked in
// that order once (ktransformers permutes the activations, not the weights, the same way).

// One tile, portable: the same integer sums and the same two FMAs a block as the vector paths,
// so every path gives the same bits.
void int8_portable(int rows, int groups, const Tile& t) {
  for (int v = 0; v < groups; ++v) {
    for (int r = 0; r < rows; ++r) {
      float acc[kGroup] = {};
      for (int64_t b = 0; b < t.nb; ++b) {
        const uint8_t* gb = t.w + v * t.gstride + b * group_bytes(kQ4_1);
        const float dx = t.xs[(b * rows + r) * 2], sx = t.xs[(b * rows + r) * 2 + 1];
        for (int lane = 0; lane < kGroup; ++lane) {
          int32_t sum = 0;
          for (int c = 0; c < 4; ++c) {
            uint32_t dw;
            std::memcpy(&dw, gb + 64 + 64 * c + 4 * lane, 4);
            for (int h = 0; h < 2; ++h) {
              int32_t x4 = t.xq[((b * 4 + c) * 2 + h) * rows + r];
              const int8_t* xb = reinterpret_cast<const int8_t*>(&x4);
              for (int j = 0; j < 4; ++j) sum += int32_t((dw >> (8 * j + 4 * h)) & 0xfu) * xb[j];
            }
          }
          const float d = half_to_float(load_u16(gb + 2 * lane)), m = half_to_float(load_u16(gb + 32 + 2 * lane));
          acc[lane] = std::fma(float(sum), d * dx, acc[lane]);
          acc[lane] = std::fma(m, sx, acc[lane]);
        }
      }
      const int64_t valid = std::min<int64_t>(kGroup, t.valid - v * kGroup);
      for (int64_t i = 0; i < valid; ++i) t.y[r * t.N + v * kGroup + i] = acc[i];
    }
  }
}

#define FT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// MR rows x NV groups; 32 registers: 2 * MR * NV (int and float sums) + 4 * NV + 1, so MR <= 12 at NV = 1.
template <int MR, int NV>
FT_VNNI void int8_vnni(const Tile& t) {
  constexpr int64_t GB = group_bytes(kQ4_1);
  __m512 out[MR][NV] = {};      // zeros
  const __m512i nib = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < t.nb; ++b) {
    const uint8_t* gb[NV];
    __m512 d[NV], m[NV];
    __m512i acc[MR][NV];
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      gb[v] = t.w + v * t.gstride + b * GB;
      prefetch_block<GB>(gb[v] + kAheadBlocks * GB);
      d[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb[v])));
      m[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb[v] + 32)));
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) acc[r][v] = _mm512_setzero_si512();
    }
    const int32_t* xb = t.xq + b * 8 * MR;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m512i lo[NV], hi[NV];
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) {
        const __m512i raw = _mm512_loadu_si512(gb[v] + 64 + 64 * c);
        lo[v] = _mm512_and_si512(raw, nib);
        hi[v] = _mm512_and_si512(_mm512_srli_epi32(raw, 4), nib);
      }
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) {
        const __m512i xe = _mm512_set1_epi32(xb[(2 * c) * MR + r]), xo = _mm512_set1_epi32(xb[(2 * c + 1) * MR + r]);
#pragma GCC unroll 32
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[r][v], lo[v], xe), hi[v], xo);
      }
    }
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m512 dx = _mm512_set1_ps(t.xs[(b * MR + r) * 2]), sx = _mm512_set1_ps(t.xs[(b * MR + r) * 2 + 1]);
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) {
        out[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][v]), _mm512_mul_ps(d[v], dx), out[r][v]);
        out[r][v] = _mm512_fmadd_ps(m[v], sx, out[r][v]);
      }
    }
  }
  for (int v = 0; v < NV; ++v)
    for (int r = 0; r < MR; ++r) store_avx512(t, r, v, out[r][v]);
}

// The same on AVX2 without VNNI (llama.cpp's way: VPMADDUBSW to 16-bit pairs, VPMADDWD to 32 bits;
// 2 x 15 x 127 stays far from 16-bit saturation); a group is two vectors. 16 registers: MR <= 3.
template <int MR>
FT_AVX2 void int8_avx2(const Tile& t) {
  constexpr int64_t GB = group_bytes(kQ4_1);
  __m256 out[MR][2];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < t.nb; ++b) {
    const uint8_t* gb = t.w + b * GB;
    __m256 d[2], m[2];
    scales_avx2<kQ4_1>(gb, d, m);
    __m256i acc[MR][2];
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const int32_t* xb = t.xq + b * 8 * MR;
    for (int c = 0; c < 4; ++c) {
      __m256i lo[2], hi[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 64 + 64 * c + 32 * h));
        lo[h] = _mm256_and_si256(raw, nib);
        hi[h] = _mm256_and_si256(_mm256_srli_epi32(raw, 4), nib);
      }
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) {
        const __m256i xe = _mm256_set1_epi32(xb[(2 * c) * MR + r]), xo = _mm256_set1_epi32(xb[(2 * c + 1) * MR + r]);
        for (int h = 0; h < 2; ++h) {
          acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(lo[h], xe), ones));
          acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(hi[h], xo), ones));
        }
      }
    }
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m256 dx = _mm256_set1_ps(t.xs[(b * MR + r) * 2]), sx = _mm256_set1_ps(t.xs[(b * MR + r) * 2 + 1]);
      for (int h = 0; h < 2; ++h) {
        out[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]), _mm256_mul_ps(d[h], dx), out[r][h]);
        out[r][h] = _mm256_fmadd_ps(m[h], sx, out[r][h]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) store_avx2(t, r, 0, out[r][0], out[r][1]);
}

// ---- picking a tile ----------------------------------------------------------------------------
using TileFn = void (*)(const Tile&);
using UnpackFn = void (*)(const uint8_t*, int64_t, float*);

// The instantiation for `rows` among the listed row counts R (nullptr if none).
template <template <int> class F, int... R>
TileFn for_rows(int rows) {
  TileFn out = nullptr;
  ((rows == R ? (out = F<R>::fn, 0) : 0), ...);
  return out;
}
template <int64_t T, int NV, bool F = false> struct Fused512 { template <int R> struct At { static constexpr TileFn fn = fused_avx512<T, R, NV, F>; }; };
template <int64_t T, int NV> struct Fused2 { template <int R> struct At { static constexpr TileFn fn = fused_avx2<T, R, NV>; }; };
template <int NV> struct Panel512 { template <int R> struct At { static constexpr TileFn fn = panel_avx512<R, NV>; }; };
template <int R> struct Panel2 { static constexpr TileFn fn = panel_avx2<R>; };

// The most activation rows one tile takes, unpacking in registers and reading a panel.
int fused_rows(int64_t isa) { return isa == kAvx512 ? 24 : isa == kAvx2 ? 4 : 8; }
int panel_rows(int64_t isa) { return isa == kAvx512 ? 12 : isa == kAvx2 ? 6 : 0; }
int panel_groups(int64_t isa) { return isa == kAvx512 ? 2 : 1; }

// Groups per fused tile for `rows` activation rows: enough independent accumulators for the FMA
// pipes (about 8 in flight) without running out of registers.
int tile_groups(int64_t isa, int rows) {
  if (isa == kAvx512) return rows == 1 ? 4 : rows <= 4 ? 2 : 1;
  if (isa == kAvx2) return rows <= 2 ? 2 : 1;
  return 1;
}

template <int64_t T>
TileFn fused512(int rows, int groups) {
  switch (groups) {
    case 4: return for_rows<Fused512<T, 4, true>::template At, 1>(rows);
    case 3: return for_rows<Fused512<T, 3, true>::template At, 1>(rows);
    case 2: return for_rows<Fused512<T, 2, true>::template At, 1, 2, 3, 4>(rows);
    default: return for_rows<Fused512<T, 1>::template At, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                             17, 18, 19, 20, 21, 22, 23, 24>(rows);
  }
}

template <int64_t T>
TileFn fused2(int rows, int groups) {
  return groups == 2 ? for_rows<Fused2<T, 2>::template At, 1, 2>(rows) : for_rows<Fused2<T, 1>::template At, 1, 2, 3, 4>(rows);
}

// Every type with a kernel, for the switches below.
#define FT_TYPES(X) X(kQ4_0) X(kQ4_1) X(kQ5_0) X(kQ5_1) X(kQ8_0) X(kQ4_K) X(kQ5_K) X(kQ6_K) X(kF16) X(kBF16)

// Whether `type` has an AVX-512 path (elsewhere an AVX-512 CPU runs the type's AVX2 one).
bool has_avx512_path(int64_t type) { return type == kQ4_1 || type == kQ8_0; }

TileFn fused_tile(int64_t isa, int64_t type, int rows, int groups) {
  if (isa == kAvx512) return type == kQ4_1 ? fused512<kQ4_1>(rows, groups) : fused512<kQ8_0>(rows, groups);
  if (isa == kAvx2) {
    switch (type) {
#define FT_CASE(T) case T: return fused2<T>(rows, groups);
      FT_TYPES(FT_CASE)
#undef FT_CASE
    }
  }
  return nullptr;
}

TileFn panel_tile(int64_t isa, int rows, int groups) {
  if (isa == kAvx512) {
    return groups == 2 ? for_rows<Panel512<2>::template At, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>(rows)
                       : for_rows<Panel512<1>::template At, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>(rows);
  }
  if (isa == kAvx2) return for_rows<Panel2, 1, 2, 3, 4, 5, 6>(rows);
  return nullptr;
}

template <int NV> struct Vnni { template <int R> struct At { static constexpr TileFn fn = int8_vnni<R, NV>; }; };
template <int R> struct Int8Avx2 { static constexpr TileFn fn = int8_avx2<R>; };

bool has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}

// The int8 paths: VNNI where the CPU has it beside AVX-512, else AVX2's multiply-adds, else portable.
int int8_rows(int64_t isa) { return isa == kAvx512 && has_vnni() ? 12 : isa >= kAvx2 ? 3 : 8; }
int int8_groups(int64_t isa, int rows) { return isa == kAvx512 && has_vnni() ? (rows == 1 ? 4 : rows <= 3 ? 2 : 1) : 1; }

TileFn int8_tile(int64_t isa, int rows, int groups) {
  if (isa == kAvx512 && has_vnni()) {
    switch (groups) {
      case 4: return for_rows<Vnni<4>::template At, 1>(rows);
      case 3: return for_rows<Vnni<3>::template At, 1>(rows);
      case 2: return for_rows<Vnni<2>::template At, 1, 2, 3>(rows);
      default: return for_rows<Vnni<1>::template At, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>(rows);
    }
  }
  return isa >= kAvx2 ? for_rows<Int8Avx2, 1, 2, 3>(rows) : nullptr;
}

UnpackFn unpacker(int64_t isa, int64_t type) {
  if (isa == kAvx512) return type == kQ4_1 ? unpack_avx512<kQ4_1> : unpack_avx512<kQ8_0>;
  if (isa == kAvx2) {
    switch (type) {
#define FT_CASE(T) case T: return unpack_avx2<T>;
      FT_TYPES(FT_CASE)
#undef FT_CASE
    }
  }
  return nullptr;
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

// Activation rows walked per pass over the groups: their fp32 rows stay in L2 (96 rows of 1536
// columns: 590 KB) while each group, in L1/L2, serves all their tiles.
constexpr int64_t kChunkRows = 96;
// Tasks per chunk of rows: small enough for the threads to even out, large enough to stream.
constexpr int64_t kTasks = 16;

// One row block of 32 rounded as llama.cpp's Q8_1 (above), into the int8 tiles' order: dwords
// {q[8c], q[8c+2], q[8c+4], q[8c+6]} and {q[8c+1], ...} for c = 0..3, `stride` dwords apart, and
// {d, s}. Halves round to even (llama.cpp's x86 paths do; its C reference rounds them away from 0).
void round_block(const float* xb, int32_t* xq, int64_t stride, float* ds) {
  float amax = 0.f;
  for (int k = 0; k < kBlock; ++k) amax = std::max(amax, std::fabs(xb[k]));
  const float id = amax > 0.f ? 127.f / amax : 0.f;
  int8_t q[kBlock];
  int32_t sum = 0;
  for (int k = 0; k < kBlock; ++k) sum += q[k] = int8_t(std::nearbyint(xb[k] * id));
  for (int c = 0; c < 4; ++c)
    for (int h = 0; h < 2; ++h) {
      const int8_t four[4] = {q[8 * c + h], q[8 * c + 2 + h], q[8 * c + 4 + h], q[8 * c + 6 + h]};
      std::memcpy(xq + (2 * c + h) * stride, four, 4);
    }
  ds[0] = float(c10::Half(amax / 127.f));
  ds[1] = float(c10::Half(float(sum) * (amax / 127.f)));
}

FT_AVX512 void round_block_avx512(const float* xb, int32_t* xq, int64_t stride, float* ds) {
  const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 id = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
  const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  // the bytes of each 8 reordered even positions first, then odd: one shuffle within 128-bit lanes
  const __m256i bytes = _mm256_set_m128i(_mm512_cvtepi32_epi8(q1), _mm512_cvtepi32_epi8(q0));
  const __m256i order = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
                                         0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  alignas(32) int32_t dw[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(dw), _mm256_shuffle_epi8(bytes, order));
  for (int j = 0; j < 8; ++j) xq[j * stride] = dw[j];
  ds[0] = float(c10::Half(amax / 127.f));
  ds[1] = float(c10::Half(float(sum) * (amax / 127.f)));
}

// Rows r of one tile rounded and packed for the int8 tiles: [block][chunk][even|odd][r] dwords,
// [block][r] pairs {d, s}.
void pack_int8(int64_t isa, const float* x, int64_t K, int64_t r, int32_t* xq, float* xs) {
  const int64_t nb = K / kBlock;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      int32_t* q = xq + b * 8 * r + i;
      float* ds = xs + (b * r + i) * 2;
      if (isa == kAvx512) round_block_avx512(x + i * K + b * kBlock, q, r, ds);
      else round_block(x + i * K + b * kBlock, q, r, ds);
    }
}

// y = x · Wᵀ: fp32 activations (`int8` false), or rounded to int8 first (Q4_1 weights only).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t rows, int64_t want_isa, bool int8) {
  const char* op = int8 ? "quant_linear_int8" : "quant_linear";
  const int64_t gbytes = group_bytes(type), qk = layout(type).qk;
  TORCH_CHECK(gbytes > 0 && (!int8 || type == kQ4_1), op, ": block type ", type,
              int8 ? " is not Q4_1 (3)" : " has no kernel here");
  TORCH_CHECK(supported(want_isa), op, ": instruction set ", want_isa, " is not available on this CPU");
  const int64_t isa = want_isa == kAvx512 && !int8 && !has_avx512_path(type) ? kAvx2 : want_isa;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), op, ": x must be a 2-D fp32 CPU tensor");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(), op, ": w must be contiguous 2-D uint8 groups");
  const int64_t M = x.size(0), K = x.size(1), G = w.size(0), N = rows;
  TORCH_CHECK(K % qk == 0 && w.size(1) == K / qk * gbytes,
              op, ": x has ", K, " columns, w's groups hold ", w.size(1), " bytes");
  TORCH_CHECK(N > (G - 1) * kGroup && N <= G * kGroup, op, ": ", N, " rows do not fill ", G, " groups of 16");
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t gstride = w.size(1), nb = K / kBlock;

  // One tile of rows unpacks in registers; more read each group from a panel unpacked once.
  const bool panel = !int8 && M > fused_rows(isa) && panel_rows(isa) > 0;
  const int most = int8 ? int8_rows(isa) : panel ? panel_rows(isa) : fused_rows(isa);
  // Tiles of nearly equal size (25 rows: 13 + 12, not 24 + 1), a chunk of them (~kChunkRows rows) a pass.
  const int64_t tiles = (M + most - 1) / most, per_chunk = std::max<int64_t>(1, kChunkRows / most);
  auto tile_start = [&](int64_t t) { return t * M / tiles; };
  const int smallest = int(tile_start(1) - tile_start(0));
  const int gpt = panel ? panel_groups(isa) : int8 ? int8_groups(isa, smallest) : tile_groups(isa, smallest);
  const int64_t task_groups = std::max<int64_t>(1, (G + kTasks - 1) / kTasks + gpt - 1) / gpt * gpt;
  const int64_t chunks = (tiles + per_chunk - 1) / per_chunk, per_pass = (G + task_groups - 1) / task_groups;

  // Each tile's activations position-major (x[k][r], as a GEMM packs its A operand), or as int8.
  const at::Tensor xc = x.contiguous();
  const float* src = xc.data_ptr<float>();
  at::Tensor packed = at::empty({int8 ? M * K / 4 : M * K}, x.options());
  // int8: {d, s} per row and block; fp32: Σ x per row and block (the factored tiles read it)
  at::Tensor scales = at::empty({(int8 ? 2 : 1) * M * nb}, x.options());
  float* xp = packed.data_ptr<float>();
  int32_t* xq = reinterpret_cast<int32_t*>(xp);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = tile_start(t), r = tile_start(t + 1) - m0;
    if (int8) {
      pack_int8(isa, src + m0 * K, K, r, xq + m0 * K / 4, scales.data_ptr<float>() + 2 * m0 * nb);
      continue;
    }
    float* sums = scales.data_ptr<float>() + m0 * nb;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t b = 0; b < nb; ++b) {
        float sum = 0.f;
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) sum += xp[m0 * K + k * r + i] = src[(m0 + i) * K + k];
        sums[b * r + i] = sum;
      }
  }
  const float* xs = scales.data_ptr<float>();
  const UnpackFn unpack = panel ? unpacker(isa, type) : nullptr;
  std::atomic<int64_t> next{0};
  const int64_t ntasks = chunks * per_pass;
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), ntasks), 1, [&](int64_t, int64_t) {
    std::vector<float> buf(panel ? gpt * kPanelK * kGroup : 0);   // the tiles' groups' panels
    for (int64_t task; (task = next.fetch_add(1)) < ntasks;) {
      const int64_t c = task / per_pass, g0 = task % per_pass * task_groups, g1 = std::min(G, g0 + task_groups);
      const int64_t t0 = c * per_chunk, t1 = std::min(tiles, t0 + per_chunk);
      for (int64_t g = g0; g < g1; g += gpt) {
        const int groups = int(std::min<int64_t>(gpt, g1 - g));
        // a panel covers K a slice at a time; the tiles of a later slice add to y
        for (int64_t k0 = 0; k0 < (panel ? K : 1); k0 += kPanelK) {
          const int64_t kn = panel ? std::min(kPanelK, K - k0) : K;
          for (int v = 0; panel && v < groups; ++v)
            unpack(wp + (g + v) * gstride + k0 / qk * gbytes, kn / kBlock, buf.data() + v * kPanelK * kGroup);
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t m0 = tile_start(t);
            const int r = int(tile_start(t + 1) - m0);
            const Tile tile{wp + g * gstride, buf.data(), gstride, kn / kBlock, k0 > 0, xp + m0 * K + k0 * r,
                            xq + m0 * K / 4, xs + (int8 ? 2 : 1) * m0 * nb, yp + m0 * N + g * kGroup, N, N - g * kGroup};
            const TileFn fn = int8 ? int8_tile(isa, r, groups) : panel ? panel_tile(isa, r, groups) : fused_tile(isa, type, r, groups);
            if (fn) fn(tile);
            else if (int8) int8_portable(r, groups, tile);
            else tile_portable(type, r, groups, tile);
          }
        }
      }
    }
  });
  return y;
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t rows, int64_t isa) {
  return linear(x, w, type, rows, isa, false);
}

at::Tensor quant_linear_int8(const at::Tensor& x, const at::Tensor& w, int64_t type, int64_t rows, int64_t isa) {
  return linear(x, w, type, rows, isa, true);
}

// ---- the int8 path's arithmetic rate: the roofline's compute roof for int8 activations ---------
// A register-resident loop of the path's multiply-adds (16 independent sums, no memory), on every
// thread at once: u8 x s8 products a second, 2 ops each (as a matmul's flops count a multiply-add).
FT_VNNI int64_t loop_vnni(int64_t iters) {
  __m512i acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_epi32(j);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
  int64_t sum = 0;
  for (int j = 0; j < 16; ++j) sum += _mm512_reduce_add_epi32(acc[j]);
  return sum;
}

FT_AVX2 int64_t loop_avx2(int64_t iters) {
  __m256i acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_set1_epi32(j);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
  alignas(32) int32_t out[8];
  int64_t sum = 0;
  for (int j = 0; j < 8; ++j) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), acc[j]);
    for (int i = 0; i < 8; ++i) sum += out[i];
  }
  return sum;
}

int64_t loop_portable(int64_t iters) {
  volatile uint8_t a = 3;
  volatile int8_t b = -2;
  int32_t acc[16] = {};
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 16; ++j) acc[j] += int32_t(a) * b;
  int64_t sum = 0;
  for (int j = 0; j < 16; ++j) sum += acc[j];
  return sum;
}

double int8_peak(int64_t isa, double seconds) {
  TORCH_CHECK(supported(isa), "int8_peak: instruction set ", isa, " is not available on this CPU");
  const std::string path = isa == kAvx512 && has_vnni() ? "vnni" : isa >= kAvx2 ? "avx2" : "portable";
  // products a loop iteration does: 16 x 64 (VNNI), 8 x 32 (AVX2), 16 (portable)
  const double per_iter = path == "vnni" ? 1024 : path == "avx2" ? 256 : 16;
  auto run = [&](int64_t iters) {
    std::atomic<int64_t> sink{0};
    const int64_t threads = at::get_num_threads();
    const auto t0 = std::chrono::steady_clock::now();
    at::parallel_for(0, threads, 1, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i)
        sink += path == "vnni" ? loop_vnni(iters) : path == "avx2" ? loop_avx2(iters) : loop_portable(iters);
    });
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return 2 * per_iter * double(iters) * double(threads) / std::max(dt, 1e-9) + 0 * double(sink.load());
  };
  int64_t iters = 1000;
  while (2 * per_iter * double(iters) / run(iters) < seconds / 8 && iters < (int64_t(1) << 40)) iters *= 4;
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) best = std::max(best, run(iters));
  return best;
}

// Which int8 path `isa` runs here: "vnni" (AVX-512 VNNI), "avx2" (VPMADDUBSW) or "portable".
std::string int8_path(int64_t isa) {
  return isa == kAvx512 && has_vnni() ? "vnni" : isa >= kAvx2 ? "avx2" : "portable";
}

// Rows `ids` of the matrix the blocks mean, fp32 [n, K]: an embedding lookup reads only its
// tokens' rows, rounded as `dequantise` rounds them (the product, then the sum), so the lookup
// equals the fp32 embedding the model would hold.
at::Tensor quant_rows(const at::Tensor& w, int64_t type, int64_t rows, const at::Tensor& ids) {
  const int64_t gbytes = group_bytes(type);
  TORCH_CHECK(gbytes > 0, "quant_rows: block type ", type, " has no kernel here");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(1) % gbytes == 0,
              "quant_rows: w must be contiguous 2-D uint8 groups");
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "quant_rows: ids must be a 1-D long tensor");
  const int64_t K = w.size(1) / gbytes * layout(type).qk, nb = K / kBlock, n = ids.size(0);
  const at::Tensor ic = ids.contiguous();
  const int64_t* ip = ic.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(ip[i] >= 0 && ip[i] < rows, "quant_rows: row ", ip[i], " is outside 0..", rows - 1);
  at::Tensor out = at::empty({n, K}, at::TensorOptions().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* g = wp + ip[i] / kGroup * w.size(1);
    const int lane = int(ip[i] % kGroup);
    for (int64_t b = 0; b < nb; ++b)
      for (int k = 0; k < kBlock; ++k) op[i * K + b * kBlock + k] = weight_portable(type, g, b, lane, k);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(first_token, m) {
  m.def("quant_linear(Tensor x, Tensor w, int type, int rows, int isa) -> Tensor");
  m.def("quant_rows(Tensor w, int type, int rows, Tensor ids) -> Tensor");
  m.def("quant_linear_int8(Tensor x, Tensor w, int type, int rows, int isa) -> Tensor");
  m.def("int8_path(int isa) -> str", &int8_path);
  m.def("int8_peak(int isa, float seconds) -> float", &int8_peak);
  m.def("isas() -> int[]", &isas);
}

TORCH_LIBRARY_IMPL(first_token, CPU, m) {
  m.impl("quant_linear", &quant_linear);
  m.impl("quant_rows", &quant_rows);
  m.impl("quant_linear_int8", &quant_linear_int8);
}
