// The small ops around a Llama layer's linear layers, fused as a serving engine fuses them (vLLM's
// CPU ops do the same): RMSNorm with the residual add, rotary embedding in place, SiLU x mul, the
// paged-KV write and decode attention read straight from the blocks (no gathered copy). Each is
// one op over every token row of a forward, so a layer is ~10 op calls instead of ~60 small
// torch ops, and each has a plain-torch reference in engine/kernels/__init__.py.
//
// Plain loops the compiler vectorises, cloned per instruction set (GCC's target_clones: an
// AVX-512, an AVX2 and a baseline copy of each, the CPU's picked when the library loads), with
// -ffp-contract=off (engine/kernels/build.py) so a*b+c rounds as torch's separate ops do.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

#define FT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

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
FT_CLONES void silu_mul_row(const float* g, const float* u, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
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
  at::parallel_for(0, B * kv_heads, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / kv_heads, g = w % kv_heads, n = len[b];
      const int64_t* table = tables.data_ptr<int64_t>() + b * tables.size(1);
      scores.resize(n);
      for (int64_t qh = g * group; qh < (g + 1) * group; ++qh)
        attend_head(qkv.data_ptr<float>() + b * qkv.size(1) + qh * d, kp + g * d, vp + g * d, table, n, bs, width, d,
                    float(scale), scores.data(), out.data_ptr<float>() + b * q_heads * d + qh * d);
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
