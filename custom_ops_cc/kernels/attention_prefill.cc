// fusekit_attention's prefill path (attention.cc describes the op): an
// item is one head and kQueryVectors SIMD vectors of queries, held
// transposed so that the vector lanes are queries.
#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_prefill.cc"
#define FUSEKIT_SIMD_MATH
#include "fusekit/simd_begin.h"
#include "kernels/attention_entry-inl.h"
#include "kernels/attention_microkernels-inl.h"

// ----------------------------------------------------------------- prefill
//
// Prefill items run transposed: the lanes of a vector are queries.  A
// block of 2 vectors of queries (one head) meets the keys block by block:
// S^T[j][queries] = K[j] . Q^T (K rows broadcast in place, Q^T packed once
// per item), the online softmax runs down the key axis with plain vector
// max/add (no horizontal reduction, no per-row scalar work), and
// O^T[c][queries] += V[j][c] * P^T[j] broadcasts V in place.  Neither K nor
// V is copied, and the only transpose is of the item's output.

// Keys per block of a prefill item (its S^T block: kKeysT x 2 vectors).
constexpr int64_t kKeysT = 128;

// A prefill block's S^T (kKeysT keys x one panel) fits the decode scores'
// buffer even at SVE's longest vectors (2048 bits: a panel of 128).
static_assert(kKeysT * 2 * hn::MaxLanes(DF()) <= att::kRows * att::kKeys,
              "S^T outgrows its buffer");
// A float16 block of V^T (Dv rows of kKeysT keys) fits vblock
// (kKeys x value_pad floats, value_pad >= Dv).
static_assert(kKeysT <= att::kKeys, "a V^T block outgrows its buffer");

// Vectors of queries per prefill item: 4 where 32 vector registers hold
// a 6-row tile of 4-vector accumulators (AVX-512: each K or V element
// broadcast feeds 4 FMAs, half the loads per FMA of 2 vectors, and a
// block of K and V, streamed from L2, serves twice the queries), else 2.
#if HWY_TARGET == HWY_AVX3
constexpr int kQueryVectors = 4;
#else
constexpr int kQueryVectors = 2;
#endif
static_assert(kKeysT * kQueryVectors * hn::MaxLanes(DF()) <= att::kRows * att::kKeys,
              "S^T outgrows its buffer");
static_assert(kQueryVectors * hn::MaxLanes(DF()) <= att::kRows || kQueryVectors == 2,
              "Q^T and O^T outgrow their buffers");

int64_t AttentionQueryPanel() {
  return kQueryVectors * static_cast<int64_t>(hn::Lanes(DF()));
}

// acc[r] (NV <= 4 vectors) = init(r, q), then for j < n: acc[r] +=
// a(r, j) * panel(j), for the MR <= 8 rows of a tile; then store(r, acc[r]).
// Named accumulators, as TileMulAdd's (sizeless SVE vectors cannot be array
// elements); statements past NV or MR are discarded (if constexpr).
#define FUSEKIT_TILEN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
template <int NV, int MR, class Init, class Scalar, class Panel, class Store>
HWY_INLINE void TileMulAddN(int64_t n, const Init& init, const Scalar& a, const Panel& panel,
                            const Store& store) {
  static_assert(NV >= 1 && NV <= 4, "a tile is 1 to 4 vectors wide");
  static_assert(MR >= 1 && MR <= 8, "a tile has 1 to 8 rows");
  const DF d;
#define FUSEKIT_TILEN_INIT(r)                                             \
  [[maybe_unused]] VF acc##r##_0 = hn::Zero(d), acc##r##_1 = acc##r##_0, \
                      acc##r##_2 = acc##r##_0, acc##r##_3 = acc##r##_0;   \
  if constexpr ((r) < MR) {                                               \
    acc##r##_0 = init(r, 0);                                              \
    if constexpr (NV > 1) acc##r##_1 = init(r, 1);                        \
    if constexpr (NV > 2) acc##r##_2 = init(r, 2);                        \
    if constexpr (NV > 3) acc##r##_3 = init(r, 3);                        \
  }
  FUSEKIT_TILEN_ROWS(FUSEKIT_TILEN_INIT)
#undef FUSEKIT_TILEN_INIT
  for (int64_t j = 0; j < n; ++j) {
    const VF b0 = panel(j, 0);
    [[maybe_unused]] VF b1 = b0, b2 = b0, b3 = b0;
    if constexpr (NV > 1) b1 = panel(j, 1);
    if constexpr (NV > 2) b2 = panel(j, 2);
    if constexpr (NV > 3) b3 = panel(j, 3);
#define FUSEKIT_TILEN_STEP(r)                                          \
  if constexpr ((r) < MR) {                                            \
    const VF x = hn::Set(d, a(r, j));                                  \
    acc##r##_0 = hn::MulAdd(x, b0, acc##r##_0);                        \
    if constexpr (NV > 1) acc##r##_1 = hn::MulAdd(x, b1, acc##r##_1);  \
    if constexpr (NV > 2) acc##r##_2 = hn::MulAdd(x, b2, acc##r##_2);  \
    if constexpr (NV > 3) acc##r##_3 = hn::MulAdd(x, b3, acc##r##_3);  \
  }
    FUSEKIT_TILEN_ROWS(FUSEKIT_TILEN_STEP)
#undef FUSEKIT_TILEN_STEP
  }
#define FUSEKIT_TILEN_STORE(r) \
  if constexpr ((r) < MR) store(r, acc##r##_0, acc##r##_1, acc##r##_2, acc##r##_3);
  FUSEKIT_TILEN_ROWS(FUSEKIT_TILEN_STORE)
#undef FUSEKIT_TILEN_STORE
}
#undef FUSEKIT_TILEN_ROWS

// Rows of an NV-vector tile: MR x NV accumulators, NV panel vectors and a
// broadcast within the register file (32 vectors on AVX-512, NEON and SVE,
// else 16).
template <int NV>
constexpr int TileRows() {
#if HWY_TARGET == HWY_AVX3 || HWY_ARCH_ARM_A64
  return NV == 4 ? 6 : 8;
#else
  return NV == 1 ? 8 : 6;
#endif
}

// out[r][0, NV vectors) = (kAccumulate ? out[r] : 0) + sum_j a(r, j) *
// panel[j] for `rows` rows r, a(r, j) = a[r * row_stride + j * inner_stride],
// j < n, panel and out rows NV vectors wide:
//   S^T = K . Q^T:   a = K (row_stride k_stride, inner 1), panel Q^T, out S^T;
//   O^T += V^T . P^T: a = V (row_stride col_stride, inner v_stride: V[j][r]
//                     as VpTile reads it), panel P^T, out O^T.
template <int NV, int MR, bool kAccumulate>
HWY_INLINE void PanelRowsN(const float* a, int64_t row_stride, int64_t inner_stride, int64_t n,
                           const float* panel, float* out, int64_t rows) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t r0 = 0;
  for (; r0 + MR <= rows; r0 += MR) {
    const float* ar = a + r0 * row_stride;
    float* o = out + r0 * NV * lanes;
    TileMulAddN<NV, MR>(
        n,
        [&](int r, int q) {
          return kAccumulate ? hn::Load(d, o + (NV * r + q) * lanes) : hn::Zero(d);
        },
        [&](int r, int64_t j) { return ar[r * row_stride + j * inner_stride]; },
        [&](int64_t j, int q) { return hn::Load(d, panel + (NV * j + q) * lanes); },
        [&](int r, VF a0, VF a1, VF a2, VF a3) {
          float* row = o + r * NV * lanes;
          hn::Store(a0, d, row);
          if constexpr (NV > 1) hn::Store(a1, d, row + lanes);
          if constexpr (NV > 2) hn::Store(a2, d, row + 2 * lanes);
          if constexpr (NV > 3) hn::Store(a3, d, row + 3 * lanes);
        });
  }
  if constexpr (MR > 1) {
    if (r0 < rows) {
      PanelRowsN<NV, MR - 1, kAccumulate>(a + r0 * row_stride, row_stride, inner_stride, n,
                                          panel, out + r0 * NV * lanes, rows - r0);
    }
  }
}

// Asks for the `count` floats from `row` on (a prefetch past the end of a
// tensor is harmless: it never faults).
HWY_INLINE void PrefetchFloats(const float* row, int64_t count) {
  for (int64_t c = 0; c < count; c += 16) __builtin_prefetch(row + c, 0, 3);
}

// The two matmuls of a block, out of line: inlined into AttentionQueriesT,
// whose online-softmax state is live around them, a tile's accumulators
// no longer fit in the 32 registers and one was spilled, which put a
// store-to-load round trip on every key of P.V.  K rows, read in place
// Hkv * D floats apart, come from L2: each tile asks for the rows of the
// next one while it computes.
// kAccumulate: S^T already holds the block's bias (the tiles start from
// it rather than from 0: no separate pass adds it).
template <int NV, bool kAccumulate = false>
HWY_NOINLINE void KqBlock(const float* k, int64_t k_stride, int64_t depth, const float* qt,
                          float* st, int64_t rows) {
  constexpr int kRowsPerTile = NV == 2 ? kMaxTile : TileRows<NV>();
  for (int64_t r = 0; r < rows; r += kRowsPerTile) {
    const int64_t m = rows - r < kRowsPerTile ? rows - r : kRowsPerTile;
    for (int64_t t = kRowsPerTile; t < 2 * kRowsPerTile; ++t) {
      PrefetchFloats(k + (r + t) * k_stride, depth);
    }
    float* out = st + r * NV * static_cast<int64_t>(hn::Lanes(DF()));
    if constexpr (NV == 2 && !kAccumulate) {
      KqRows<kMaxTile>(k + r * k_stride, k_stride, depth, qt, out, m);
    } else {
      PanelRowsN<NV, kRowsPerTile, kAccumulate>(k + r * k_stride, k_stride, 1, depth, qt, out,
                                                m);
    }
  }
}

// P.V goes over the block's keys kVpKeys at a time (every column tile per
// step, each accumulating in key order as in one pass): V rows Hkv * Dv
// floats apart (1 KiB with 4 heads of 64) fall on a few L1 sets, and a
// whole block's rows per column tile evicted each other before the next
// tile could reuse them.
// fresh: O^T holds nothing yet (an item's first block): the first keys'
// tiles start from 0 instead of loading it.
constexpr int64_t kVpKeys = 32;
template <int NV>
HWY_NOINLINE void VpBlock(const float* v, int64_t v_stride, int64_t col_stride, int64_t n,
                          const float* pt, float* ot, int64_t cols, bool fresh) {
  const int64_t width = NV * static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t j = 0; j < n; j += kVpKeys) {
    const int64_t m = n - j < kVpKeys ? n - j : kVpKeys;
    if (fresh && j == 0) {
      constexpr int kRowsPerTile = NV == 2 ? kMaxTile : TileRows<NV>();
      PanelRowsN<NV, kRowsPerTile, false>(v, col_stride, v_stride, m, pt, ot, cols);
    } else if constexpr (NV == 2) {
      VpRows<kMaxTile>(v + j * v_stride, v_stride, col_stride, m, pt + j * width, ot, cols);
    } else {
      PanelRowsN<NV, TileRows<NV>(), true>(v + j * v_stride, col_stride, v_stride, m,
                                           pt + j * width, ot, cols);
    }
  }
}

// The mask of one (batch, head) when it is the same for every query row (its
// query stride is 0: a padding mask [B, 1, 1, Skv]): one value per key, an
// additive float or a bool keep.
struct KeyRow {
  const float* add = nullptr;
  const uint8_t* keep = nullptr;
  int64_t stride = 0;  // between keys (0: one value for every key)

  bool present() const { return add != nullptr || keep != nullptr; }
  // Key j is dropped: its weight is an exact 0 (a -inf bias or a false keep).
  bool Dropped(int64_t j) const {
    return add != nullptr ? add[j * stride] == -std::numeric_limits<float>::infinity()
                          : !keep[j * stride];
  }
  // [jb, jb + n) narrowed to its first and last kept key (n = 0: none).
  void Trim(int64_t& jb, int64_t& n) const {
    int64_t end = jb + n;
    while (jb < end && Dropped(jb)) ++jb;
    while (end > jb && Dropped(end - 1)) --end;
    n = end - jb;
  }
  // S^T rows of keys jb.. (n of them, `width` floats each: one value per
  // query lane) get their key's bias, or -inf when it is dropped.
  void Apply(DF d, int64_t jb, int64_t n, float* HWY_RESTRICT st, int64_t width) const {
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    if (add != nullptr) {
      for (int64_t j = 0; j < n; ++j) {
        const VF m = hn::Set(d, add[(jb + j) * stride]);
        float* srow = st + j * width;
        for (int64_t c = 0; c < width; c += lanes) {
          hn::Store(hn::Add(hn::Load(d, srow + c), m), d, srow + c);
        }
      }
      return;
    }
    const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n; ++j) {
      if (keep[(jb + j) * stride]) continue;
      for (int64_t c = 0; c < width; c += lanes) hn::Store(neg_inf, d, st + j * width + c);
    }
  }
};

template <typename T>
KeyRow KeyRowOf(const att::Problem<T>& p, int64_t b, int64_t h) {
  KeyRow row;
  const int64_t* ms = p.mask_stride;
  if (ms[2] != 0) return row;  // differs across queries
  const int64_t at = b * ms[0] + h * ms[1];
  if (p.mask_add != nullptr) row.add = p.mask_add + at;
  if (p.mask_keep != nullptr) row.keep = p.mask_keep + at;
  row.stride = ms[3];
  return row;
}

// Queries of vector `part` of an item of nq queries (0 to lanes).
HWY_INLINE int64_t PartLanes(int64_t nq, int64_t part, int64_t lanes) {
  const int64_t rest = nq - part * lanes;
  return rest <= 0 ? 0 : (rest < lanes ? rest : lanes);
}

// Gather offsets of lanes 0.. `stride` apart, lanes past `valid` (>= 1)
// reading lane valid - 1 again: a partial vector gathers only in bounds.
template <class DI>
HWY_INLINE hn::Vec<DI> ClampedIndex(DI di, int64_t valid, int64_t stride) {
  const auto lane = hn::Min(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(valid - 1)));
  return hn::Mul(lane, hn::Set(di, static_cast<int32_t>(stride)));
}

// ------------------------------------------------ tile transposes
//
// Q^T, a per-query bias and the item's output cross between rows of
// queries (memory) and lanes of queries (the item's panels).  A gather per
// vector did it at about 12 cycles a vector on AVX-512 (a quarter of the
// T5 encoder's attention time, bias included); an in-register transpose
// of a lanes x lanes tile costs log2(lanes) shuffles a vector.  Targets
// without one (the x86 baseline, NEON, SVE) keep the gathers.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
constexpr bool kTileTranspose = true;
#else
constexpr bool kTileTranspose = false;
#endif

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
// A tile of `rows` rows of `cols` floats (row r from src + r * stride;
// both at most the lanes), rows and columns past them read as 0, handed on
// by columns: emit(c, column c across the rows) for c < cols.
template <class Emit>
HWY_INLINE void TransposeTile(const float* HWY_RESTRICT src, int64_t stride, int64_t rows,
                              int64_t cols, const Emit& emit) {
  const DF d;
  constexpr int L = static_cast<int>(hn::MaxLanes(DF()));
  const bool full = cols == L;
  const auto keep = hn::FirstN(d, static_cast<size_t>(cols));
  using V = decltype(hn::Zero(d).raw);
  V r[L];
  if (full && rows == L) {
    for (int i = 0; i < L; ++i) r[i] = hn::LoadU(d, src + i * stride).raw;
  } else {
    for (int i = 0; i < L; ++i) {
      const float* row = src + i * stride;
      r[i] = i >= rows ? hn::Zero(d).raw
                       : (full ? hn::LoadU(d, row) : hn::MaskedLoad(keep, d, row)).raw;
    }
  }
  // Pairs of rows interleaved, then pairs of pairs: u[4 g + m] holds, in
  // 128-bit block k, column 4 k + m of rows 4 g .. 4 g + 3.
  V u[L];
  for (int g = 0; g < L / 4; ++g) {
    V t[4];
#if HWY_TARGET == HWY_AVX3
    t[0] = _mm512_unpacklo_ps(r[4 * g], r[4 * g + 1]);
    t[1] = _mm512_unpackhi_ps(r[4 * g], r[4 * g + 1]);
    t[2] = _mm512_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]);
    t[3] = _mm512_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]);
    u[4 * g] = _mm512_shuffle_ps(t[0], t[2], 0x44);
    u[4 * g + 1] = _mm512_shuffle_ps(t[0], t[2], 0xEE);
    u[4 * g + 2] = _mm512_shuffle_ps(t[1], t[3], 0x44);
    u[4 * g + 3] = _mm512_shuffle_ps(t[1], t[3], 0xEE);
#else
    t[0] = _mm256_unpacklo_ps(r[4 * g], r[4 * g + 1]);
    t[1] = _mm256_unpackhi_ps(r[4 * g], r[4 * g + 1]);
    t[2] = _mm256_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]);
    t[3] = _mm256_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]);
    u[4 * g] = _mm256_shuffle_ps(t[0], t[2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
    u[4 * g + 2] = _mm256_shuffle_ps(t[1], t[3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
#endif
  }
  // Then the 128-bit blocks: column c is whole.
  V out[L];
#if HWY_TARGET == HWY_AVX3
  V w[L];
  for (int m = 0; m < 4; ++m) {
    for (int h = 0; h < 2; ++h) {  // rows 0-7, then 8-15
      const V a = u[8 * h + m], b = u[8 * h + 4 + m];
      // Blocks (col m, col 8 + m, col m, col 8 + m) of rows 8h + (0-3, 0-3,
      // 4-7, 4-7), and the same for columns 4 + m and 12 + m.
      w[8 * h + m] = _mm512_shuffle_f32x4(a, b, 0x88);
      w[8 * h + 4 + m] = _mm512_shuffle_f32x4(a, b, 0xDD);
    }
    out[m] = _mm512_shuffle_f32x4(w[m], w[8 + m], 0x88);
    out[8 + m] = _mm512_shuffle_f32x4(w[m], w[8 + m], 0xDD);
    out[4 + m] = _mm512_shuffle_f32x4(w[4 + m], w[12 + m], 0x88);
    out[12 + m] = _mm512_shuffle_f32x4(w[4 + m], w[12 + m], 0xDD);
  }
#else
  for (int m = 0; m < 4; ++m) {
    out[m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x20);
    out[4 + m] = _mm256_permute2f128_ps(u[m], u[4 + m], 0x31);
  }
#endif
  for (int c = 0; c < L; ++c) {
    if (c < cols) emit(c, VF{out[c]});
  }
}
#else
template <class Emit>
HWY_INLINE void TransposeTile(const float*, int64_t, int64_t, int64_t, const Emit&) {}
#endif

// exp(x - m) for the online softmax's weights, exactly 0 where x - m <=
// -87 (as SoftmaxExpZero).  On AVX-512, y = (x - m) / ln 2, 2^(y - floor y)
// a degree-5 polynomial on [0, 1) (relative error 1.5e-7) and VSCALEFPS
// multiplies it by 2^floor(y): 11 vector ops where SoftmaxExpZero takes
// 14, in the pass that was the largest part of an item besides its two
// matmuls.  (x - m is formed first: folding it into one FMA with m / ln 2
// precomputed overflows where a row's max is near the float minimum an
// exporter masks with, -3.4e38 / ln 2 = -inf, and gives NaN.)
HWY_INLINE VF ExpBelowMax(DF d, VF x, VF m) {
#if HWY_TARGET == HWY_AVX3
  const VF y = hn::Mul(hn::Sub(x, m), hn::Set(d, 1.44269504088896341f));
  const VF f{_mm512_reduce_ps(y.raw, 0x09)};  // y - floor(y): round down, quiet
  VF p = hn::Set(d, 0.0018775765784084797f);
  p = hn::MulAdd(p, f, hn::Set(d, 0.008989340625703335f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.05582631751894951f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.24015361070632935f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.6931530833244324f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.9999999403953552f));
  // -87 / ln 2: lanes at or below it (and -inf, NaN) weigh an exact 0.
  const __mmask16 keep = _mm512_cmp_ps_mask(y.raw, _mm512_set1_ps(-125.51545f), _CMP_GT_OQ);
  return VF{_mm512_maskz_scalef_ps(keep, p.raw, y.raw)};
#else
  return SoftmaxExpZero(d, hn::Sub(x, m));
#endif
}

// One prefill item: head h of batch b, queries [i0, i0 + nq) with nq at
// most NV (<= kQueryVectors) vectors.  Scratch: see Buffers (q holds Q^T, s holds
// S^T, o O^T; with float16 storage kblock and vblock hold a block of K and
// V as float).
template <int NV, typename T>
void AttentionQueriesT(const att::Problem<T>& p, int64_t b, int64_t h, int64_t i0, int64_t nq,
                       float* scratch, const att::Layout& l) {
  constexpr bool kInPlace = std::is_same_v<T, float>;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t width = NV * lanes;
  const Buffers buf = Carve(p, l, scratch);
  const int64_t depth = p.depth, dv = p.value_depth;
  // float32 K and V rows are read in place.  (A contiguous copy per head,
  // which keeps rows Hkv * D floats apart off a few L1 sets, measured
  // slower: the copy costs more than the conflicts.)  float16 blocks are
  // converted once per block, a vector at a time: about 1/16 of the FMAs
  // that then read them.
  // In every layout K rows are contiguous (k_row apart); V rows too
  // (v_row apart) except in the transposed layout, where V^T rows of
  // keys are: P.V then broadcasts V^T elements along a key row (VpRows'
  // column stride), each tile row streaming through its own V^T row.
  const int64_t kv_head = h / p.group;
  const int64_t k_row = p.k_row, v_row = p.v_row, v_col = p.v_col;
  const T* k_head = p.k + b * p.k_batch + kv_head * p.k_head;
  const T* v_head = p.v + b * p.v_batch + kv_head * p.v_head;
  const int64_t offset = p.kv_len - p.q_len;  // causal: key j <= i + offset

  // Q^T, scaled; lanes past nq are zero (their columns are never written).
  // A full panel is gathered a vector of queries at a time.
  float* qt = buf.q;
  const T* q_rows = p.q + b * p.q_batch + i0 * p.q_row + h * p.q_head;
  const int64_t q_stride = p.q_row;
  const hn::RebindToSigned<DF> di;
  if constexpr (!kInPlace) {
    // No 16-bit gather: each query row a vector at a time, then scattered.
    std::memset(qt, 0, sizeof(float) * depth * width);
    HWY_ALIGN float row[hn::MaxLanes(DF())];
    const VF scale = hn::Set(d, p.scale);
    for (int64_t i = 0; i < nq; ++i) {
      const T* src = q_rows + i * q_stride;
      for (int64_t c0 = 0; c0 < depth; c0 += lanes) {
        const int64_t m = depth - c0 < lanes ? depth - c0 : lanes;
        const VF x =
            m == lanes ? LoadF(d, src + c0) : LoadTailF(d, src + c0, static_cast<size_t>(m));
        hn::Store(hn::Mul(x, scale), d, row);
        for (int64_t c = 0; c < m; ++c) qt[(c0 + c) * width + i] = row[c];
      }
    }
  } else if (kTileTranspose) {
    // Lanes x lanes tiles of query rows turned into Q^T columns; rows past
    // nq read as 0.
    const VF scale = hn::Set(d, p.scale);
    for (int64_t part = 0; part < NV; ++part) {
      const int64_t valid = PartLanes(nq, part, lanes);
      float* dst = qt + part * lanes;
      const float* src = q_rows + part * lanes * q_stride;
      for (int64_t c0 = 0; c0 < depth; c0 += lanes) {
        if (valid == 0) {
          for (int64_t c = c0; c < depth && c < c0 + lanes; ++c) {
            hn::Store(hn::Zero(d), d, dst + c * width);
          }
          continue;
        }
        const int64_t cols = depth - c0 < lanes ? depth - c0 : lanes;
        TransposeTile(src + c0, q_stride, valid, cols, [&](int64_t c, VF x) {
          hn::Store(hn::Mul(x, scale), d, dst + (c0 + c) * width);
        });
      }
    }
  } else if (width * q_stride <= INT32_MAX) {
    // A partial vector of queries (49 of a Swin window in 64 lanes) gathers
    // its last query again into the lanes past nq, then zeroes them.
    const VF scale = hn::Set(d, p.scale);
    for (int64_t part = 0; part < NV; ++part) {
      const int64_t valid = PartLanes(nq, part, lanes);
      float* dst = qt + part * lanes;
      if (valid == 0) {
        for (int64_t c = 0; c < depth; ++c) hn::Store(hn::Zero(d), d, dst + c * width);
        continue;
      }
      const auto index = ClampedIndex(di, valid, q_stride);
      const auto keep = hn::FirstN(d, static_cast<size_t>(valid));
      const float* src = q_rows + part * lanes * q_stride;
      for (int64_t c = 0; c < depth; ++c) {
        const VF x = hn::GatherIndex(d, src + c, index);
        hn::Store(hn::IfThenElseZero(keep, hn::Mul(x, scale)), d, dst + c * width);
      }
    }
  } else {
    std::memset(qt, 0, sizeof(float) * depth * width);
    for (int64_t i = 0; i < nq; ++i) {
      const float* src = q_rows + i * q_stride;
      for (int64_t c = 0; c < depth; ++c) qt[c * width + i] = src[c] * p.scale;
    }
  }
  // O^T: written by the first block's P.V (zeroed below if no block runs).
  float* ot = buf.o;
  // The online softmax's running max and sum of each query lane.
  HWY_ALIGN float run_max[kQueryVectors * hn::MaxLanes(DF())];
  HWY_ALIGN float run_sum[kQueryVectors * hn::MaxLanes(DF())];
  for (int64_t c = 0; c < width; c += lanes) {
    hn::Store(hn::Set(d, kNegInf), d, run_max + c);
    hn::Store(hn::Zero(d), d, run_sum + c);
  }

  int64_t key_end = p.kv_len;
  if (p.causal && i0 + nq - 1 + offset + 1 < key_end) key_end = i0 + nq - 1 + offset + 1;
  float* st = buf.s;
  const int64_t* ms = p.mask_stride;
  // A mask the same for every query (query stride 0: a padding mask) is one
  // value per key, read once per key for all the item's queries.
  // A float mask of one value for every query and key of (b, h), 0 (a
  // [1, 1, 1, 1] zero bias an exporter left in), changes no score: it is
  // not added block by block.
  const bool zero_mask = p.mask_add != nullptr && ms[2] == 0 && ms[3] == 0 &&
                         p.mask_add[b * ms[0] + h * ms[1]] == 0.0f;
  const KeyRow row = zero_mask ? KeyRow{} : KeyRowOf(p, b, h);
  const bool bias_tiles = kTileTranspose && p.mask_add != nullptr && p.softcap == 0.0f &&
                          ms[2] > 0 && ms[3] == 1;
  bool first_block = true;  // O^T is still 0: nothing to rescale
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeysT) {
    int64_t jb = j0;
    int64_t n = key_end - j0 < kKeysT ? key_end - j0 : kKeysT;
    if (row.present()) {
      // Keys the row drops weigh exactly 0 and move no max: the block
      // shrinks to its first and last kept key, or is skipped.
      row.Trim(jb, n);
      if (n == 0) continue;
    }
    // A float bias per query and key, keys contiguous, is laid into S^T
    // first (transposed, lanes x lanes tiles at a time) and Q.K^T
    // accumulates onto it.  (Not under a softcap, which comes between.)
    const bool bias_first = bias_tiles && !row.present();
    if (bias_first) {
      const float* base = p.mask_add + b * ms[0] + h * ms[1] + i0 * ms[2] + jb;
      for (int64_t part = 0; part < NV; ++part) {
        const int64_t valid = PartLanes(nq, part, lanes);
        float* dst = st + part * lanes;
        const float* src = base + part * lanes * ms[2];
        for (int64_t j0 = 0; j0 < n; j0 += lanes) {
          if (valid == 0) {
            for (int64_t j = j0; j < n && j < j0 + lanes; ++j) {
              hn::Store(hn::Zero(d), d, dst + j * width);
            }
            continue;
          }
          const int64_t cols = n - j0 < lanes ? n - j0 : lanes;
          // The bias streams from L2, a line per row and tile: the next
          // tile's lines are asked for while this one is turned.
          if (j0 + lanes < n) {
            for (int64_t r = 0; r < valid; ++r) {
              __builtin_prefetch(src + r * ms[2] + j0 + lanes, 0, 3);
            }
          }
          TransposeTile(src + j0, ms[2], valid, cols,
                        [&](int64_t j, VF x) { hn::Store(x, d, dst + (j0 + j) * width); });
        }
      }
    }
    if constexpr (kInPlace) {
      if (bias_first) {
        KqBlock<NV, true>(k_head + jb * k_row, k_row, depth, qt, st, n);
      } else {
        KqBlock<NV>(k_head + jb * k_row, k_row, depth, qt, st, n);
      }
    } else {
      ConvertRows(k_head + jb * k_row, k_row, n, depth, buf.kblock, depth);
      if (bias_first) {
        KqBlock<NV, true>(buf.kblock, depth, depth, qt, st, n);
      } else {
        KqBlock<NV>(buf.kblock, depth, depth, qt, st, n);
      }
    }
    // The scale is in Q^T; the cap (Gemma 2) comes before the mask.
    if (p.softcap > 0.0f) SoftcapRow(st, n * width, p.softcap);
    if (bias_first || zero_mask) {
      // (added above, or nothing to add)
    } else if (row.present()) {
      row.Apply(d, jb, n, st, width);
    } else if (p.mask_add != nullptr && ms[2] == 1) {
      // A key-major bias (mask_layout 'bhkq': a constant bias the fusion
      // stored transposed): each key's values for the item's queries are
      // contiguous, loaded a vector of queries at a time.
      const float* base = p.mask_add + b * ms[0] + h * ms[1] + i0 + jb * ms[3];
      for (int64_t part = 0; part < NV; ++part) {
        const int64_t valid = PartLanes(nq, part, lanes);
        if (valid == 0) break;
        const float* m = base + part * lanes;
        float* scol = st + part * lanes;
        for (int64_t j = 0; j < n; ++j) {
          float* s = scol + j * width;
          const VF bias = valid == lanes ? hn::LoadU(d, m + j * ms[3])
                                         : LoadTail(d, m + j * ms[3], static_cast<size_t>(valid));
          hn::Store(hn::Add(hn::Load(d, s), bias), d, s);
        }
      }
    } else if (p.mask_add != nullptr && ms[2] > 0 && width * ms[2] <= INT32_MAX) {
      // A bias per query (relative positions, a window mask): S^T's lanes
      // are queries, so each key's values are gathered ms[2] apart, a
      // vector of queries at a time (a scalar loop over them cost as much
      // as the block's Q.K^T at Swin's windows).
      const float* base = p.mask_add + b * ms[0] + h * ms[1] + i0 * ms[2] + jb * ms[3];
      for (int64_t part = 0; part < NV; ++part) {
        const int64_t valid = PartLanes(nq, part, lanes);
        if (valid == 0) break;
        const auto index = ClampedIndex(di, valid, ms[2]);
        const float* m = base + part * lanes * ms[2];
        float* scol = st + part * lanes;
        for (int64_t j = 0; j < n; ++j) {
          float* s = scol + j * width;
          hn::Store(hn::Add(hn::Load(d, s), hn::GatherIndex(d, m + j * ms[3], index)), d, s);
        }
      }
    } else if (p.mask_add != nullptr || p.mask_keep != nullptr) {
      const int64_t base = b * ms[0] + h * ms[1] + i0 * ms[2];
      for (int64_t j = 0; j < n; ++j) {
        float* srow = st + j * width;
        const int64_t at = base + (jb + j) * ms[3];
        for (int64_t i = 0; i < nq; ++i) {
          if (p.mask_add != nullptr) {
            srow[i] += p.mask_add[at + i * ms[2]];
          } else if (!p.mask_keep[at + i * ms[2]]) {
            srow[i] = kNegInf;
          }
        }
      }
    }
    if (p.causal && jb + n - 1 > i0 + offset) {
      // Key j is dropped for the queries i < j - offset.
      const VF neg_inf = hn::Set(d, kNegInf);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t first_kept = jb + j - offset - i0;
        float* srow = st + j * width;
        for (int64_t c = 0; c < width && c < first_kept; c += lanes) {
          const int64_t drop = first_kept - c;
          if (drop >= lanes) {
            hn::Store(neg_inf, d, srow + c);
          } else {
            const auto m = hn::FirstN(d, static_cast<size_t>(drop));
            hn::Store(hn::IfThenElse(m, neg_inf, hn::Load(d, srow + c)), d, srow + c);
          }
        }
      }
    }
    // The online softmax, one vector of query lanes at a time down the
    // block's keys.
    const VF neg_inf = hn::Set(d, kNegInf);
    for (int64_t c = 0; c < width; c += lanes) {
      float* col = st + c;
      const VF old_max = hn::Load(d, run_max + c);
      // Four chains of max (one would wait on each max's latency).
      VF m0 = old_max, m1 = old_max, m2 = old_max, m3 = old_max;
      int64_t j = 0;
      for (; j + 4 <= n; j += 4) {
        m0 = hn::Max(m0, hn::Load(d, col + j * width));
        m1 = hn::Max(m1, hn::Load(d, col + (j + 1) * width));
        m2 = hn::Max(m2, hn::Load(d, col + (j + 2) * width));
        m3 = hn::Max(m3, hn::Load(d, col + (j + 3) * width));
      }
      for (; j < n; ++j) m0 = hn::Max(m0, hn::Load(d, col + j * width));
      const VF bmax = hn::Max(hn::Max(m0, m1), hn::Max(m2, m3));
      // Lanes without an admissible key so far subtract 0 (their weights
      // are exact zeros either way).
      const VF sub = hn::IfThenZeroElse(hn::Eq(bmax, neg_inf), bmax);
      const VF alpha = SoftmaxExpZero(d, hn::Sub(old_max, sub));
      hn::Store(bmax, d, run_max + c);
      VF add0 = hn::Zero(d), add1 = hn::Zero(d);
      for (j = 0; j + 2 <= n; j += 2) {
        const VF e0 = ExpBelowMax(d, hn::Load(d, col + j * width), sub);
        const VF e1 = ExpBelowMax(d, hn::Load(d, col + (j + 1) * width), sub);
        hn::Store(e0, d, col + j * width);
        hn::Store(e1, d, col + (j + 1) * width);
        add0 = hn::Add(add0, e0);
        add1 = hn::Add(add1, e1);
      }
      if (j < n) {
        const VF e = ExpBelowMax(d, hn::Load(d, col + j * width), sub);
        hn::Store(e, d, col + j * width);
        add0 = hn::Add(add0, e);
      }
      const VF add = hn::Add(add0, add1);
      hn::Store(hn::MulAdd(hn::Load(d, run_sum + c), alpha, add), d, run_sum + c);
      if (!first_block) {
        for (int64_t x = 0; x < dv; ++x) {
          float* o = ot + x * width + c;
          hn::Store(hn::Mul(hn::Load(d, o), alpha), d, o);
        }
      }
    }
    const bool fresh = first_block;
    first_block = false;
    if constexpr (kInPlace) {
      VpBlock<NV>(v_head + jb * v_row, v_row, v_col, n, st, ot, dv, fresh);
    } else if (l.value_transposed) {
      // The block's V^T rows (dv of them, n keys each) converted as rows.
      ConvertRows(v_head + jb, v_col, dv, n, buf.vblock, kKeysT);
      VpBlock<NV>(buf.vblock, 1, kKeysT, n, st, ot, dv, fresh);
    } else {
      ConvertRows(v_head + jb * v_row, v_row, n, dv, buf.vblock, dv);
      VpBlock<NV>(buf.vblock, dv, 1, n, st, ot, dv, fresh);
    }
  }

  if (first_block) std::memset(ot, 0, sizeof(float) * dv * width);  // no key block ran
  // out[b, i0 + i, h, c] = O^T[c][i] / sum[i]; no admissible key: zeros.
  HWY_ALIGN float inv[kQueryVectors * hn::MaxLanes(DF())];
  const VF zero = hn::Zero(d);
  for (int64_t c = 0; c < width; c += lanes) {
    const VF sum = hn::Load(d, run_sum + c);
    hn::Store(hn::IfThenElseZero(hn::Gt(sum, zero), hn::Div(hn::Set(d, 1.0f), sum)), d, inv + c);
  }
  if (kTileTranspose) {
    // Lanes x lanes tiles of O^T (value columns x queries) turned into
    // output rows.
    for (int64_t part = 0; part < NV; ++part) {
      const int64_t valid = PartLanes(nq, part, lanes);
      if (valid == 0) break;
      T* dst = p.out + b * p.o_batch + (i0 + part * lanes) * p.o_row + h * p.o_head;
      for (int64_t c0 = 0; c0 < dv; c0 += lanes) {
        const int64_t rows = dv - c0 < lanes ? dv - c0 : lanes;
        TransposeTile(ot + c0 * width + part * lanes, width, rows, valid, [&](int64_t i, VF x) {
          const VF y = hn::Mul(x, hn::Set(d, inv[part * lanes + i]));
          T* out_row = dst + i * p.o_row + c0;
          if (rows == lanes) {
            StoreF(y, d, out_row);
          } else {
            StoreTailF(y, d, out_row, static_cast<size_t>(rows));
          }
        });
      }
    }
    return;
  }
  // Column i of O^T gathered a vector of value columns at a time.
  const auto column = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(width)));
  for (int64_t i = 0; i < nq; ++i) {
    T* dst = p.out + b * p.o_batch + (i0 + i) * p.o_row + h * p.o_head;
    const VF factor = hn::Set(d, inv[i]);
    int64_t c = 0;
    for (; c + lanes <= dv; c += lanes) {
      StoreF(hn::Mul(hn::GatherIndex(d, ot + c * width + i, column), factor), d, dst + c);
    }
    if (c < dv) {
      HWY_ALIGN float rest[hn::MaxLanes(DF())] = {};
      for (int64_t t = 0; c + t < dv; ++t) rest[t] = ot[(c + t) * width + i] * inv[i];
      StoreTailF(hn::Load(d, rest), d, dst + c, static_cast<size_t>(dv - c));
    }
  }
}

// An item of nq queries runs as wide as its queries need: the last item
// of a head (197 tokens = 3 x 64 + 5 on AVX-512) would otherwise compute a
// whole 4-vector panel for a few queries (a quarter of ViT-S's FMAs).
template <typename T>
void AttentionQueriesAnyWidth(const att::Problem<T>& p, int64_t b, int64_t h, int64_t i0,
                              int64_t nq, float* scratch, const att::Layout& l) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t vectors = (nq + lanes - 1) / lanes;
  if constexpr (kQueryVectors == 4) {
    if (vectors >= 4) return AttentionQueriesT<4>(p, b, h, i0, nq, scratch, l);
    if (vectors == 3) return AttentionQueriesT<3>(p, b, h, i0, nq, scratch, l);
  }
  if (vectors >= 2) return AttentionQueriesT<2>(p, b, h, i0, nq, scratch, l);
  AttentionQueriesT<1>(p, b, h, i0, nq, scratch, l);
}

void AttentionQueriesF32(const att::Problem<float>& p, int64_t b, int64_t h, int64_t i0,
                         int64_t nq, float* scratch, const att::Layout& l) {
  AttentionQueriesAnyWidth(p, b, h, i0, nq, scratch, l);
}
void AttentionQueriesF16(const att::Problem<F16>& p, int64_t b, int64_t h, int64_t i0,
                         int64_t nq, float* scratch, const att::Layout& l) {
  AttentionQueriesAnyWidth(p, b, h, i0, nq, scratch, l);
}

#include "fusekit/simd_end.h"
