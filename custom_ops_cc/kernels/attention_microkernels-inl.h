// fusekit_attention's building blocks shared by prefill and decode (per
// SIMD target): the register-tiled matmul kernels, the softmax's exp and
// row reductions, and the carving of a thread's scratch.
// Included inside namespace fusekit::HWY_NAMESPACE, after
// fusekit/simd_begin.h (Highway's per-target include guard: no #pragma
// once, re-included for every SIMD target).

#if defined(FUSEKIT_KERNELS_ATTENTION_MICROKERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_KERNELS_ATTENTION_MICROKERNELS_INL_H_
#undef FUSEKIT_KERNELS_ATTENTION_MICROKERNELS_INL_H_
#else
#define FUSEKIT_KERNELS_ATTENTION_MICROKERNELS_INL_H_
#endif

#include "kernels/attention_f16-inl.h"

// Rows of a register tile: 2 x kMaxTile accumulators, 2 vectors of the
// panel and a broadcast fit in 32 vector registers (AVX-512, NEON, SVE) or
// 16 (AVX2 and the x86 baseline).
#if HWY_TARGET == HWY_AVX3 || HWY_ARCH_ARM_A64
constexpr int kMaxTile = 8;
#else
constexpr int kMaxTile = 6;
#endif

// Keys per K panel: 2 SIMD vectors.
HWY_INLINE int64_t PanelKeys() { return 2 * static_cast<int64_t>(hn::Lanes(DF())); }

// ------------------------------------------------ register tiles
//
// acc[r] (2 vectors) = init(r), then for j < n: acc[r] += a(r, j) * panel(j),
// for the MR <= 8 rows of a tile, then store(r, acc[r]).  The accumulators
// are named variables, not an array: SVE's vectors are sizeless types,
// which cannot be array elements or struct members.  Each statement is
// written once for 8 rows and discarded past MR (if constexpr), so the
// compiler sees the same straight-line code as from an unrolled loop over
// an array.
#define FUSEKIT_TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

template <int MR, class Init, class Scalar, class Panel, class Store>
HWY_INLINE void TileMulAdd(int64_t n, const Init& init, const Scalar& a, const Panel& panel,
                           const Store& store) {
  static_assert(MR >= 1 && MR <= 8, "a tile has 1 to 8 rows");
  const DF d;
#define FUSEKIT_TILE_INIT(r)                                     \
  [[maybe_unused]] VF acc##r##_0 = hn::Zero(d), acc##r##_1 = acc##r##_0; \
  if constexpr ((r) < MR) {                                      \
    acc##r##_0 = init(r, 0);                                     \
    acc##r##_1 = init(r, 1);                                     \
  }
  FUSEKIT_TILE_ROWS(FUSEKIT_TILE_INIT)
#undef FUSEKIT_TILE_INIT
  for (int64_t j = 0; j < n; ++j) {
    const VF b0 = panel(j, 0);
    const VF b1 = panel(j, 1);
#define FUSEKIT_TILE_STEP(r)                           \
  if constexpr ((r) < MR) {                            \
    const VF x = hn::Set(d, a(r, j));                  \
    acc##r##_0 = hn::MulAdd(x, b0, acc##r##_0);        \
    acc##r##_1 = hn::MulAdd(x, b1, acc##r##_1);        \
  }
    FUSEKIT_TILE_ROWS(FUSEKIT_TILE_STEP)
#undef FUSEKIT_TILE_STEP
  }
#define FUSEKIT_TILE_STORE(r) \
  if constexpr ((r) < MR) store(r, acc##r##_0, acc##r##_1);
  FUSEKIT_TILE_ROWS(FUSEKIT_TILE_STORE)
#undef FUSEKIT_TILE_STORE
}
#undef FUSEKIT_TILE_ROWS

// S[r][0, panel) = Q[r] . Kpanel for MR rows; Q rows are `depth` apart.
template <int MR>
HWY_INLINE void QkTile(const float* HWY_RESTRICT q, int64_t depth,
                       const float* HWY_RESTRICT kp, float* HWY_RESTRICT s,
                       int64_t s_stride) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      depth, [&](int, int) { return hn::Zero(d); },
      [&](int r, int64_t k) { return q[r * depth + k]; },
      [&](int64_t k, int half) { return hn::Load(d, kp + (2 * k + half) * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::StoreU(a0, d, s + r * s_stride);
        hn::StoreU(a1, d, s + r * s_stride + lanes);
      });
}

// O[r][0, 2 vectors) += sum_j P[r][j] * V[j][0, 2 vectors) for MR rows
// (V of storage type TV, promoted as it is loaded).
template <int MR, typename TV>
HWY_INLINE void PvTile(const float* HWY_RESTRICT p, int64_t p_stride, int64_t n,
                       const TV* HWY_RESTRICT v, int64_t v_stride,
                       float* HWY_RESTRICT o, int64_t o_stride) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      n, [&](int r, int half) { return hn::LoadU(d, o + r * o_stride + half * lanes); },
      [&](int r, int64_t j) { return p[r * p_stride + j]; },
      [&](int64_t j, int half) { return LoadF(d, v + j * v_stride + half * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::StoreU(a0, d, o + r * o_stride);
        hn::StoreU(a1, d, o + r * o_stride + lanes);
      });
}

template <int MR>
HWY_INLINE void QkRows(const float* q, int64_t depth, const float* kp, float* s,
                       int64_t s_stride, int64_t rows) {
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) {
    QkTile<MR>(q + r * depth, depth, kp, s + r * s_stride, s_stride);
  }
  if constexpr (MR > 1) {
    if (r < rows) QkRows<MR - 1>(q + r * depth, depth, kp, s + r * s_stride, s_stride, rows - r);
  }
}

template <int MR, typename TV>
HWY_INLINE void PvRows(const float* p, int64_t p_stride, int64_t n, const TV* v,
                       int64_t v_stride, float* o, int64_t o_stride, int64_t rows) {
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) {
    PvTile<MR>(p + r * p_stride, p_stride, n, v, v_stride, o + r * o_stride, o_stride);
  }
  if constexpr (MR > 1) {
    if (r < rows) {
      PvRows<MR - 1>(p + r * p_stride, p_stride, n, v, v_stride, o + r * o_stride, o_stride,
                     rows - r);
    }
  }
}

// S^T[r][0, 2 vectors) = K[r] . Q^T for MR key rows (K rows k_stride apart).
template <int MR>
HWY_INLINE void KqTile(const float* HWY_RESTRICT k, int64_t k_stride, int64_t depth,
                       const float* HWY_RESTRICT qt, float* HWY_RESTRICT st) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      depth, [&](int, int) { return hn::Zero(d); },
      [&](int r, int64_t c) { return k[r * k_stride + c]; },
      [&](int64_t c, int half) { return hn::Load(d, qt + (2 * c + half) * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::Store(a0, d, st + r * 2 * lanes);
        hn::Store(a1, d, st + r * 2 * lanes + lanes);
      });
}

template <int MR>
HWY_INLINE void KqRows(const float* k, int64_t k_stride, int64_t depth, const float* qt,
                       float* st, int64_t rows) {
  const int64_t width = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  int64_t r = 0;
  for (; r + MR <= rows; r += MR) {
    KqTile<MR>(k + r * k_stride, k_stride, depth, qt, st + r * width);
  }
  if constexpr (MR > 1) {
    if (r < rows) KqRows<MR - 1>(k + r * k_stride, k_stride, depth, qt, st + r * width, rows - r);
  }
}

// O^T[r][0, 2 vectors) += sum_j V[j][r] * P^T[j] for MR value columns r.
template <int MR>
HWY_INLINE void VpTile(const float* HWY_RESTRICT v, int64_t v_stride, int64_t n,
                       const float* HWY_RESTRICT pt, float* HWY_RESTRICT ot) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  TileMulAdd<MR>(
      n, [&](int r, int half) { return hn::Load(d, ot + (2 * r + half) * lanes); },
      [&](int r, int64_t j) { return v[j * v_stride + r]; },
      [&](int64_t j, int half) { return hn::Load(d, pt + (2 * j + half) * lanes); },
      [&](int r, VF a0, VF a1) {
        hn::Store(a0, d, ot + r * 2 * lanes);
        hn::Store(a1, d, ot + r * 2 * lanes + lanes);
      });
}

template <int MR>
HWY_INLINE void VpRows(const float* v, int64_t v_stride, int64_t n, const float* pt,
                       float* ot, int64_t cols) {
  const int64_t width = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  int64_t r = 0;
  for (; r + MR <= cols; r += MR) VpTile<MR>(v + r, v_stride, n, pt, ot + r * width);
  if constexpr (MR > 1) {
    if (r < cols) VpRows<MR - 1>(v + r, v_stride, n, pt, ot + r * width, cols - r);
  }
}

// Largest of s[0, n).
HWY_INLINE float RowMax(const float* HWY_RESTRICT s, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  VF m = neg_inf;
  int64_t c = 0;
  for (; c + lanes <= n; c += lanes) m = hn::Max(m, hn::LoadU(d, s + c));
  if (c < n) {
    const size_t rest = static_cast<size_t>(n - c);
    m = hn::Max(m, hn::IfThenElse(hn::FirstN(d, rest), LoadTail(d, s + c, rest), neg_inf));
  }
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// exp(x) for the softmax's x = s - max <= 0, as 2^y with y = x / ln 2 =
// k + f (k integer, |f| <= 1/2): 2^f from a degree-5 polynomial fitted at
// Chebyshev nodes (relative error 1.1e-7), times 2^k.  Below 2^-126 (and
// at -inf) it clamps to about 1e-38 instead of 0: no weight that small
// moves a float32 output.  About 10 vector ops where a general exp needs 20.
HWY_INLINE VF SoftmaxExp(DF d, VF x) {
  const VF y = hn::Max(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, -126.0f));
  const VF k = hn::Round(y);
  const VF f = hn::Sub(y, k);
  VF p = hn::Set(d, 0.0013400432164886263f);
  p = hn::MulAdd(p, f, hn::Set(d, 0.009676037097852109f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.05550327214210872f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.24022107355830596f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.6931472067106195f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.000000075495349f));
#if HWY_TARGET == HWY_AVX3
  return VF{_mm512_scalef_ps(p.raw, k.raw)};
#else
  // k + 127, the biased exponent of 2^k, lands in the low mantissa bits
  // of k + 1.5 * 2^23 + 127.
  const hn::RebindToSigned<DF> di;
  const VF biased = hn::Add(k, hn::Set(d, 12582912.0f + 127.0f));
  return hn::Mul(p, hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, biased))));
#endif
}

// s[0, n) = softcap * tanh(s / softcap): the scores' soft-capping.
HWY_INLINE void SoftcapRow(float* HWY_RESTRICT s, int64_t n, float softcap) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF cap = hn::Set(d, softcap);
  int64_t c = 0;
  for (; c + lanes <= n; c += lanes) {
    hn::StoreU(hn::Mul(cap, hn::Tanh(d, hn::Div(hn::LoadU(d, s + c), cap))), d, s + c);
  }
  if (c < n) {
    const size_t rest = static_cast<size_t>(n - c);
    StoreTail(hn::Mul(cap, hn::Tanh(d, hn::Div(LoadTail(d, s + c, rest), cap))), d, s + c,
              rest);
  }
}

// s[0, n) = exp(s - max); returns their sum.
HWY_INLINE float ExpRow(float* HWY_RESTRICT s, int64_t n, float max) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF vm = hn::Set(d, max);
  VF sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * lanes <= n; c += 2 * lanes) {
    const VF e0 = SoftmaxExp(d, hn::Sub(hn::LoadU(d, s + c), vm));
    const VF e1 = SoftmaxExp(d, hn::Sub(hn::LoadU(d, s + c + lanes), vm));
    hn::StoreU(e0, d, s + c);
    hn::StoreU(e1, d, s + c + lanes);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  for (; c < n; c += lanes) {
    const size_t rest = static_cast<size_t>(n - c < lanes ? n - c : lanes);
    const VF e = hn::IfThenElseZero(hn::FirstN(d, rest),
                                    SoftmaxExp(d, hn::Sub(LoadTail(d, s + c, rest), vm)));
    StoreTail(e, d, s + c, rest);
    sum0 = hn::Add(sum0, e);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
}

HWY_INLINE void ScaleRow(float* HWY_RESTRICT o, int64_t n, float factor) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF f = hn::Set(d, factor);
  for (int64_t c = 0; c < n; c += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, o + c), f), d, o + c);
}

// The same exp with exact zeros at -inf (and below 2^-126): a lane whose
// running max is still -inf subtracts 0, and its -inf scores must weigh 0.
HWY_INLINE VF SoftmaxExpZero(DF d, VF x) {
  return hn::IfThenElseZero(hn::Gt(x, hn::Set(d, -87.0f)), SoftmaxExp(d, x));
}

// Buffers of one thread, carved from its share of the scratch.
// (Prefill: q holds Q^T [D][panel], s S^T [kKeysT][panel], o O^T
// [Dv][panel]; att::QueryFloats and OutFloats make room for the widest
// panel.)
struct Buffers {
  float* q;      // [kRows][D], scaled queries
  float* s;      // [kRows][kKeys], scores then weights
  float* o;      // [kRows][value_pad], unnormalized output rows
  float* max;    // [kRows]
  float* sum;    // [kRows]
  float* kblock; // [D][kKeys] K panels of one block (decode)
  float* vblock; // [kKeys][value_pad] V rows of one block (decode, ragged Dv)
};

template <typename T>
HWY_INLINE Buffers Carve(const att::Problem<T>& p, const att::Layout& l, float* base) {
  // Sizes as att::ThreadFloats counts them.
  Buffers buf;
  buf.q = base;
  base += att::QueryFloats(p, l);
  buf.s = base;
  base += att::kRows * att::kKeys;
  buf.o = base;
  base += att::OutFloats(l);
  buf.max = base;
  base += att::kRows;
  buf.sum = base;
  base += att::kRows;
  buf.kblock = base;
  base += att::KBlockFloats(p, l);
  buf.vblock = base;
  return buf;
}

#endif  // FUSEKIT_KERNELS_ATTENTION_MICROKERNELS_INL_H_
