// fusekit_rotary_embedding: rotary position embedding (RoPE) of the first R
// channels of every head.
//
//   inputs  x [B, S, H, D] float32; cos, sin float32 of one shape, last dim R,
//           broadcastable to x's [B, S, H, R]: [S, R], [B|1, S, R] (read as
//           [B|1, S, 1, R]) or [B|1, S, 1|H, R] (1 in place of S also works)
//   attrs   interleaved (bool, false), rotary_dim (int, 0: R is D)
//   output  y [B, S, H, D]:  y[..., :R] = x[..., :R] * cos + rot(x[..., :R]) * sin,
//                            y[..., R:] = x[..., R:]
//   rot     interleaved=false (NeoX / Llama "rotate half"): concat(-x2, x1)
//           interleaved=true  (GPT-J): (x[2i], x[2i+1]) -> (-x[2i+1], x[2i])
//
// The op reads x once and writes y once, so it is bound by memory bandwidth:
// cos/sin rows are shared by every head of a position and stay in L1, and
// the arithmetic (two multiplies per element) hides under the loads.
#include <cstdint>
#include <cstring>

#ifndef FUSEKIT_ROTARY_ARGS_
#define FUSEKIT_ROTARY_ARGS_
namespace fusekit {
// Everything a chunk of (b, s) rows needs; strides are in floats and are 0
// along the dims cos/sin broadcast over.
struct RotaryArgs {
  const float* x;
  const float* cos;
  const float* sin;
  float* y;
  int64_t seq, heads, depth, rotary;
  int64_t cs_batch, cs_seq, cs_head;
  bool interleaved;
};
}  // namespace fusekit
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rotary_embedding.cc"
#include "fusekit/simd_begin.h"

template <class D>
HWY_INLINE hn::VFromD<D> LoadN(D d, const float* HWY_RESTRICT p, size_t n, bool full) {
  return full ? hn::LoadU(d, p) : LoadTail(d, p, n);
}
template <class D>
HWY_INLINE void StoreN(hn::VFromD<D> v, D d, float* HWY_RESTRICT p, size_t n, bool full) {
  if (full) {
    hn::StoreU(v, d, p);
  } else {
    StoreTail(v, d, p, n);
  }
}

// Rotate-half on one head: lane j of the first half pairs with lane j of the
// second, so no shuffle is needed.
HWY_INLINE void RotateHalf(const float* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                           const float* HWY_RESTRICT s, float* HWY_RESTRICT y,
                           int64_t half) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  if constexpr (hn::MaxLanes(d) * sizeof(float) >= 64) {
    // A vector is a whole cache line here, and stores alternating between
    // y[j] and y[half + j] ran at 1.5x memcpy out of DRAM (measured, AVX-512
    // on Zen 4); writing each half in order runs at memcpy speed.  The
    // second read of x comes from L1.
    for (int64_t j = 0; j < half; j += lanes) {
      const size_t n = static_cast<size_t>(half - j < lanes ? half - j : lanes);
      const bool full = n == static_cast<size_t>(lanes);
      const auto x1 = LoadN(d, x + j, n, full);
      const auto x2 = LoadN(d, x + half + j, n, full);
      StoreN(hn::NegMulAdd(x2, LoadN(d, s + j, n, full), hn::Mul(x1, LoadN(d, c + j, n, full))),
             d, y + j, n, full);
    }
    for (int64_t j = 0; j < half; j += lanes) {
      const size_t n = static_cast<size_t>(half - j < lanes ? half - j : lanes);
      const bool full = n == static_cast<size_t>(lanes);
      const auto x1 = LoadN(d, x + j, n, full);
      const auto x2 = LoadN(d, x + half + j, n, full);
      StoreN(hn::MulAdd(x1, LoadN(d, s + half + j, n, full),
                        hn::Mul(x2, LoadN(d, c + half + j, n, full))),
             d, y + half + j, n, full);
    }
  } else {
    // Narrower vectors are bound by load slots instead: read x once and
    // write both halves from it.
    for (int64_t j = 0; j < half; j += lanes) {
      const size_t n = static_cast<size_t>(half - j < lanes ? half - j : lanes);
      const bool full = n == static_cast<size_t>(lanes);
      const auto x1 = LoadN(d, x + j, n, full);
      const auto x2 = LoadN(d, x + half + j, n, full);
      StoreN(hn::NegMulAdd(x2, LoadN(d, s + j, n, full), hn::Mul(x1, LoadN(d, c + j, n, full))),
             d, y + j, n, full);
      StoreN(hn::MulAdd(x1, LoadN(d, s + half + j, n, full),
                        hn::Mul(x2, LoadN(d, c + half + j, n, full))),
             d, y + half + j, n, full);
    }
  }
}

// GPT-J pairs sit in neighbouring lanes: swap each pair (Reverse2) and flip
// the sign of the even lanes.  Every vector starts at an even channel and
// holds an even number of lanes, and R is even, so a pair never straddles
// two vectors (nor the masked tail).
HWY_INLINE void RotateInterleaved(const float* HWY_RESTRICT x, const float* HWY_RESTRICT c,
                                  const float* HWY_RESTRICT s, float* HWY_RESTRICT y,
                                  int64_t rotary) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto even_sign = hn::OddEven(hn::Zero(d), hn::Set(d, -0.0f));
  for (int64_t j = 0; j < rotary; j += lanes) {
    const size_t n = static_cast<size_t>(rotary - j < lanes ? rotary - j : lanes);
    const bool full = n == static_cast<size_t>(lanes);
    const auto xv = LoadN(d, x + j, n, full);
    const auto rot = hn::Xor(hn::Reverse2(d, xv), even_sign);
    const auto out = hn::MulAdd(rot, LoadN(d, s + j, n, full),
                                hn::Mul(xv, LoadN(d, c + j, n, full)));
    StoreN(out, d, y + j, n, full);
  }
}

void RotaryRows(const RotaryArgs& a, int64_t begin, int64_t end) {
  const int64_t pass = a.depth - a.rotary;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t b = row / a.seq, t = row % a.seq;
    const float* c_row = a.cos + b * a.cs_batch + t * a.cs_seq;
    const float* s_row = a.sin + b * a.cs_batch + t * a.cs_seq;
    const int64_t base = row * a.heads * a.depth;
    for (int64_t h = 0; h < a.heads; ++h) {
      const float* xh = a.x + base + h * a.depth;
      float* yh = a.y + base + h * a.depth;
      const float* ch = c_row + h * a.cs_head;
      const float* sh = s_row + h * a.cs_head;
      if (a.interleaved) {
        RotateInterleaved(xh, ch, sh, yh, a.rotary);
      } else {
        RotateHalf(xh, ch, sh, yh, a.rotary / 2);
      }
      if (pass > 0) {
        std::memcpy(yh + a.rotary, xh + a.rotary, static_cast<size_t>(pass) * sizeof(float));
      }
    }
  }
}

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace fusekit {
namespace {

std::string ShapeText(const Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank(); ++i) s += (i ? ", " : "") + std::to_string(t.dim(i));
  return s + "]";
}

class RotaryEmbedding {
 public:
  RotaryEmbedding(const Attrs& attrs, std::string* error)
      : interleaved_(attrs.Bool("interleaved")),
        rotary_dim_(attrs.Int("rotary_dim")),
        rows_(FUSEKIT_SIMD_CHOOSE(RotaryRows)) {
    if (rotary_dim_ < 0 || rotary_dim_ % 2 != 0) {
      *error = "attr 'rotary_dim' must be 0 (all of D) or an even number > 0, got " +
               std::to_string(rotary_dim_);
    }
  }

  TfLiteStatus Prepare(OpContext& ctx, In<float> x, In<float> cos, In<float> sin,
                       Out<float> y) {
    FUSEKIT_ENSURE(ctx, x.rank() == 4,
                   "x must have rank 4 [batch, seq, heads, head_dim], got rank %d %s",
                   x.rank(), ShapeText(x).c_str());
    FUSEKIT_ENSURE(ctx, cos.shape() == sin.shape(),
                   "cos and sin must have the same shape, got cos %s and sin %s",
                   ShapeText(cos).c_str(), ShapeText(sin).c_str());
    FUSEKIT_ENSURE(ctx, cos.rank() >= 2 && cos.rank() <= 4,
                   "cos/sin must have rank 2 [seq, R], 3 [batch|1, seq, R] or 4 "
                   "[batch|1, seq, heads|1, R], got rank %d %s",
                   cos.rank(), ShapeText(cos).c_str());
    const int depth = x.dim(3);
    const int rotary = cos.dim(-1);
    FUSEKIT_ENSURE(ctx, rotary % 2 == 0,
                   "rotary dim R (last dim of cos/sin) must be even, got %d", rotary);
    FUSEKIT_ENSURE(ctx, rotary <= depth,
                   "rotary dim R=%d (last dim of cos/sin) exceeds x's head_dim D=%d",
                   rotary, depth);
    FUSEKIT_ENSURE(ctx, rotary_dim_ <= depth,
                   "attr rotary_dim=%lld exceeds x's head_dim D=%d",
                   static_cast<long long>(rotary_dim_), depth);
    const int expected = rotary_dim_ > 0 ? static_cast<int>(rotary_dim_) : depth;
    FUSEKIT_ENSURE(ctx, rotary == expected,
                   "last dim of cos/sin must be %d (%s), got %d", expected,
                   rotary_dim_ > 0 ? "attr rotary_dim" : "x's head_dim, as rotary_dim=0",
                   rotary);

    // cos/sin as [batch, seq, heads, R] with 1 where a dim is left out.
    const int r = cos.rank();
    const int cb = r >= 3 ? cos.dim(0) : 1;
    const int cs = cos.dim(r - 2 - (r == 4 ? 1 : 0));
    const int chd = r == 4 ? cos.dim(2) : 1;
    struct Dim {
      const char* what;
      int have, want, index;
    };
    const Dim dims[3] = {{"batch", cb, x.dim(0), r >= 3 ? 0 : -1},
                         {"seq", cs, x.dim(1), r >= 3 ? 1 : 0},
                         {"heads", chd, x.dim(2), r == 4 ? 2 : -1}};
    for (const Dim& dim : dims) {
      FUSEKIT_ENSURE(ctx, dim.have == 1 || dim.have == dim.want,
                     "cos/sin %s does not broadcast to x %s: dim %d (%s) is %d, must be "
                     "1 or %d",
                     ShapeText(cos).c_str(), ShapeText(x).c_str(), dim.index, dim.what,
                     dim.have, dim.want);
    }
    const int64_t R = rotary;
    cs_head_ = chd == 1 ? 0 : R;
    cs_seq_ = cs == 1 ? 0 : int64_t{chd} * R;
    cs_batch_ = cb == 1 ? 0 : int64_t{cs} * chd * R;
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, In<float> cos, In<float> sin,
                      Out<float> y) {
    if (x.num_elements() == 0) return kTfLiteOk;
    const RotaryArgs args{x.data(),  cos.data(), sin.data(), y.data(),
                          x.dim(1),  x.dim(2),   x.dim(3),   cos.dim(-1),
                          cs_batch_, cs_seq_,    cs_head_,   interleaved_};
    const int64_t rows = int64_t{x.dim(0)} * x.dim(1);
    const int64_t row_floats = int64_t{x.dim(2)} * x.dim(3);
    // About 16 KB of x per chunk keeps the hand-off cost well under the work.
    const int64_t grain = row_floats >= 4096 ? 1 : 4096 / row_floats + 1;
    ctx.ParallelFor(rows, grain,
                    [&](int64_t begin, int64_t end) { rows_(args, begin, end); });
    return kTfLiteOk;
  }

 private:
  bool interleaved_;
  int64_t rotary_dim_;
  void (*rows_)(const RotaryArgs&, int64_t, int64_t);
  int64_t cs_batch_ = 0, cs_seq_ = 0, cs_head_ = 0;  // set by Prepare
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("fusekit_rotary_embedding", RotaryEmbedding,
                        Inputs("x", "cos", "sin"), Outputs("y"),
                        AttrSchema(attr::Bool("interleaved", false),
                                   attr::Int("rotary_dim", 0)));

}  // namespace fusekit

#endif  // HWY_ONCE
