// fusekit_group_norm: group normalization of a channels-last tensor.
//
//   inputs  x [B, *spatial, C] float32 (rank 2 to 5), gamma [C] and beta
//           [C], each optional (absent: tensor index -1)
//   attrs   groups (int, required, >= 1, divides C), epsilon (float >= 0,
//           1e-5).  Options version 2; version 1 packed the present
//           gamma/beta after x, named by bool attrs `scale` and `center`
//           (the SDK maps such nodes).
//   output  y = (x - mean) * rsqrt(var + epsilon) * gamma[c] + beta[c], where
//           mean/var are taken per batch item and group over every spatial
//           position and the group's C/groups consecutive channels.
//
// Memory layout drives the design.  In channels-last memory a group is a
// short run of C/groups floats repeated every C floats, so gathering one
// group at a time would read each cache line `groups` times for a handful of
// useful lanes.  Instead the kernel streams x contiguously and accumulates
// a sum and a sum of squares per *channel* (a C-wide row of accumulators,
// added to at every spatial position); the lanes are folded into groups
// only once, at the end.  When C is not a multiple of the vector width, the
// accumulator row is widened to W = k*C floats (k positions per "row"),
// which is a multiple of the width, so every load is a full vector with the
// same channel in the same lane on every row.
//
// Per batch item the work is then: statistics (one read of x), a tiny
// combine in double, and one pass writing y = (x - shift[c]) * s[c] + t[c].
// The batch item is split into items of rows; each item leaves its per-
// channel partial sums in scratch and the combine adds them in item order,
// so the result is bitwise independent of the thread count and of whether
// the items ran on one thread or several.
//
// Accuracy: each channel's values are summed around a shift (the channel's
// value at the first position), which keeps the one-pass variance exact to
// float32 rounding even when the mean is large against the spread (offset
// 1e4).  A float lane sums at most kMaxItemRows terms before the item's
// partials go to double, and the group combine is done in double.  The
// output is computed from x - shift (exact for values near the mean) and a
// per-channel offset t folded in double, so the rounding of the mean itself
// never meets x.
#include <cmath>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/group_norm.cc"
#include "fusekit/simd_begin.h"

size_t GroupNormLanes() { return hn::Lanes(hn::ScalableTag<float>()); }

// Accumulates R rows of x (row stride W) into s1/s2 around shift, one column
// vector at a time; the partial last vector of a row (W % lanes floats)
// loads zeros against the zero padding of shift.  Two partial sums per
// column keep the dependency chains short.
template <int R, class D>
HWY_INLINE void StatsRows(D d, const float* HWY_RESTRICT p, int64_t W, int64_t full,
                          size_t rest, int64_t padded, const float* HWY_RESTRICT shift,
                          float* HWY_RESTRICT s1, float* HWY_RESTRICT s2) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < padded; j += lanes) {
    const bool whole = j < full;
    const auto sh = hn::Load(d, shift + j);
    auto a1 = hn::Zero(d), b1 = hn::Zero(d), a2 = hn::Zero(d), b2 = hn::Zero(d);
    for (int k = 0; k < R; k += 2) {
      const float* q = p + k * W + j;
      const auto d0 = hn::Sub(whole ? hn::LoadU(d, q) : LoadTail(d, q, rest), sh);
      a1 = hn::Add(a1, d0);
      a2 = hn::MulAdd(d0, d0, a2);
      if (k + 1 < R) {
        const auto d1 =
            hn::Sub(whole ? hn::LoadU(d, q + W) : LoadTail(d, q + W, rest), sh);
        b1 = hn::Add(b1, d1);
        b2 = hn::MulAdd(d1, d1, b2);
      }
    }
    hn::Store(hn::Add(hn::Load(d, s1 + j), hn::Add(a1, b1)), d, s1 + j);
    hn::Store(hn::Add(hn::Load(d, s2 + j), hn::Add(a2, b2)), d, s2 + j);
  }
}

// Statistics of rows [row_begin, row_end) of one batch item xb, viewed as
// full_rows rows of W floats followed by one partial row of `tail` floats.
// shift, acc: W floats padded with zeros to a whole number of vectors (acc
// is this worker's, 2 such rows: sums then sums of squares).  Writes the
// per-channel sums around shift to out[0, C) and out[C, 2C) in double.
void GroupNormStats(const float* HWY_RESTRICT xb, int64_t W, int64_t C,
                    int64_t row_begin, int64_t row_end, int64_t full_rows,
                    int64_t tail, const float* HWY_RESTRICT shift,
                    float* HWY_RESTRICT acc, double* HWY_RESTRICT out) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t padded = (W + lanes - 1) / lanes * lanes;
  float* HWY_RESTRICT s1 = acc;
  float* HWY_RESTRICT s2 = acc + padded;
  for (int64_t j = 0; j < 2 * padded; j += lanes) hn::Store(hn::Zero(d), d, acc + j);

  const int64_t full = W / lanes * lanes;
  const size_t rest = static_cast<size_t>(W - full);
  const int64_t end_full = row_end < full_rows ? row_end : full_rows;
  int64_t r = row_begin;
  // Eight rows per sweep: a column's accumulators are loaded and stored once
  // per eight vectors of x, which keeps the sweep at load-port speed.
  for (; r + 8 <= end_full; r += 8) {
    StatsRows<8>(d, xb + r * W, W, full, rest, padded, shift, s1, s2);
  }
  for (; r < end_full; ++r) {
    StatsRows<1>(d, xb + r * W, W, full, rest, padded, shift, s1, s2);
  }
  if (row_end > full_rows && tail > 0) {
    // The partial last row holds `tail` floats (whole positions); lanes past
    // it load 0 against a nonzero shift and are masked out.
    const float* HWY_RESTRICT p = xb + full_rows * W;
    for (int64_t j = 0; j < tail; j += lanes) {
      const size_t n = static_cast<size_t>(tail - j < lanes ? tail - j : lanes);
      const auto v = n == static_cast<size_t>(lanes) ? hn::LoadU(d, p + j)
                                                     : LoadTail(d, p + j, n);
      const auto dv =
          hn::IfThenElseZero(hn::FirstN(d, n), hn::Sub(v, hn::Load(d, shift + j)));
      hn::Store(hn::Add(hn::Load(d, s1 + j), dv), d, s1 + j);
      hn::Store(hn::MulAdd(dv, dv, hn::Load(d, s2 + j)), d, s2 + j);
    }
  }

  // Fold the W lanes (k positions of C channels) into C channels.
  for (int64_t c = 0; c < 2 * C; ++c) out[c] = 0.0;
  for (int64_t q = 0; q < W; q += C) {
    for (int64_t c = 0; c < C; ++c) {
      out[c] += static_cast<double>(s1[q + c]);
      out[C + c] += static_cast<double>(s2[q + c]);
    }
  }
}

// y = (x - shift) * scale + offset on one row of W = full + rest floats.
template <class D>
HWY_INLINE void ApplyRow(D d, const float* HWY_RESTRICT p, float* HWY_RESTRICT o,
                         int64_t full, size_t rest, const float* HWY_RESTRICT shift,
                         const float* HWY_RESTRICT scale, const float* HWY_RESTRICT offset) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < full; j += lanes) {
    const auto v = hn::Sub(hn::LoadU(d, p + j), hn::Load(d, shift + j));
    hn::StoreU(hn::MulAdd(v, hn::Load(d, scale + j), hn::Load(d, offset + j)), d, o + j);
  }
  if (rest > 0) {
    const auto v = hn::Sub(LoadTail(d, p + full, rest), hn::Load(d, shift + full));
    StoreTail(hn::MulAdd(v, hn::Load(d, scale + full), hn::Load(d, offset + full)), d,
              o + full, rest);
  }
}

// y = (x - shift) * scale + offset for rows [row_begin, row_end) (same row
// view as GroupNormStats); shift, scale, offset are W floats, zero-padded.
void GroupNormApply(const float* HWY_RESTRICT xb, float* HWY_RESTRICT yb, int64_t W,
                    int64_t row_begin, int64_t row_end, int64_t full_rows, int64_t tail,
                    const float* HWY_RESTRICT shift, const float* HWY_RESTRICT scale,
                    const float* HWY_RESTRICT offset) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t full = W / lanes * lanes;
  const size_t rest = static_cast<size_t>(W - full);
  const int64_t end_full = row_end < full_rows ? row_end : full_rows;
  // One row at a time, in memory order: sweeping several rows column by
  // column saves parameter loads but interleaves that many store streams,
  // which measured ~1.5x slower once y is not in L1.
  for (int64_t r = row_begin; r < end_full; ++r) {
    ApplyRow(d, xb + r * W, yb + r * W, full, rest, shift, scale, offset);
  }
  if (row_end > full_rows && tail > 0) {
    const float* HWY_RESTRICT p = xb + full_rows * W;
    float* HWY_RESTRICT o = yb + full_rows * W;
    for (int64_t j = 0; j < tail; j += lanes) {
      const size_t n = static_cast<size_t>(tail - j < lanes ? tail - j : lanes);
      const bool whole = n == static_cast<size_t>(lanes);
      const auto v = whole ? hn::LoadU(d, p + j) : LoadTail(d, p + j, n);
      const auto out = hn::MulAdd(hn::Sub(v, hn::Load(d, shift + j)),
                                  hn::Load(d, scale + j), hn::Load(d, offset + j));
      if (whole) {
        hn::StoreU(out, d, o + j);
      } else {
        StoreTail(out, d, o + j, n);
      }
    }
  }
}

#include "fusekit/simd_end.h"

#if HWY_ONCE

#include <algorithm>
#include <string>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "fusekit/simd.h"

namespace fusekit {
namespace {

using LanesFn = size_t (*)();
using StatsFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         const float*, float*, double*);
using ApplyFn = void (*)(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                         const float*, const float*, const float*);

// Rows per item: at most this many, so that a float lane sums few terms
// before the item's partials go to double ...
constexpr int64_t kMaxItemRows = 128;
// ... and at least this many, so that an item's partials (2*C doubles) stay
// small next to the x it covers (at most a quarter of its bytes).
constexpr int64_t kMinItemRows = 16;
// About 128 KB of x per item: enough work per ParallelFor claim and per fold.
constexpr int64_t kItemFloats = 32768;
// Accumulator rows wider than this fall back to W = C with masked ends.
constexpr int64_t kMaxWideRow = 4096;

int64_t Gcd(int64_t a, int64_t b) {
  while (b != 0) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// How one invocation splits its work; a function of the shape and the SIMD
// width only (never of the thread count), so results do not depend on it.
struct Plan {
  int64_t batch, positions, channels, groups;
  int64_t lanes;
  int64_t W;        // floats per accumulator row: k whole positions
  int64_t padded;   // W rounded up to whole vectors
  int64_t full_rows, tail;  // per batch item: rows of W, then tail floats
  int64_t rows;             // full_rows + (tail > 0)
  int64_t item_rows, items;  // per batch item

  Plan(int64_t b, int64_t p, int64_t c, int64_t g, int64_t lanes_)
      : batch(b), positions(p), channels(c), groups(g), lanes(lanes_) {
    const int64_t wide = c * (lanes / Gcd(c, lanes));
    if (wide <= kMaxWideRow) {
      // At least 8 vectors per row: a column's accumulators are reloaded
      // only after the other columns, never straight after their store.
      const int64_t min_floats = 8 * lanes;
      W = wide * std::max<int64_t>(1, (min_floats + wide - 1) / wide);
    } else {
      W = c;
    }
    padded = RoundUp(W, lanes);
    const int64_t per_row = W / c;
    full_rows = p / per_row;
    tail = (p % per_row) * c;
    rows = full_rows + (tail > 0 ? 1 : 0);
    item_rows = std::clamp<int64_t>(kItemFloats / W, kMinItemRows, kMaxItemRows);
    items = std::max<int64_t>(1, (rows + item_rows - 1) / item_rows);
  }
};

// Scratch: per worker its accumulator rows; per "slot" (one batch item in
// flight) its shift/scale/offset rows and its items' partial sums.
struct Layout {
  ScratchLayout scratch;
  ScratchArray<float> acc;        // [2][padded] per worker
  ScratchArray<float> params;     // [3][padded] per slot: shift, scale, offset
  ScratchArray<double> partials;  // [items][2][channels] per slot
  int workers;
  int64_t slots;
  bool per_batch;  // one task per batch item (slot = worker), else slot = batch item

  Layout(const Plan& plan, int workers_, bool per_batch_)
      : workers(workers_),
        slots(per_batch_ ? workers_ : plan.batch),
        per_batch(per_batch_) {
    acc = scratch.Add<float>(2 * plan.padded, workers);
    params = scratch.Add<float>(3 * plan.padded, slots);
    partials = scratch.Add<double>(2 * plan.channels * plan.items, slots);
  }
};

// One slot's arrays in the scratch block.
struct Slot {
  float* shift;
  float* scale;
  float* offset;
  double* partials;
  Slot(const Plan& plan, const Layout& layout, void* base, int64_t s)
      : shift(layout.params(base, s)),
        scale(shift + plan.padded),
        offset(scale + plan.padded),
        partials(layout.partials(base, s)) {}
};

class GroupNorm {
 public:
  GroupNorm(const Attrs& attrs, std::string*)
      : groups_(attrs.Int("groups")),
        epsilon_(static_cast<float>(attrs.Float("epsilon"))),
        lanes_(static_cast<int64_t>(FUSEKIT_SIMD_CHOOSE(GroupNormLanes)())),
        stats_(FUSEKIT_SIMD_CHOOSE(GroupNormStats)),
        apply_(FUSEKIT_SIMD_CHOOSE(GroupNormApply)) {}

  // The SDK checked x's rank, groups >= 1 and that gamma and beta, where
  // present, are vectors of x's channels.
  TfLiteStatus Prepare(OpContext& ctx, In<float> x, Opt<float>, Opt<float>, Out<float> y) {
    const int channels = x.dim(-1);
    FUSEKIT_ENSURE(ctx, channels % groups_ == 0,
                   "attr groups=%lld does not divide the %d channels of x (last dim)",
                   static_cast<long long>(groups_), channels);
    // Reserve the scratch now rather than in the first Invoke.
    if (x.num_elements() > 0) {
      const Plan plan = MakePlan(x);
      ctx.Scratch(MakeLayout(plan, ctx.num_threads()).scratch);
    }
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(OpContext& ctx, In<float> x, Opt<float> gamma_in, Opt<float> beta_in,
                      Out<float> y) {
    if (x.num_elements() == 0) return kTfLiteOk;
    const Plan plan = MakePlan(x);
    const int threads = ctx.num_threads();
    const Layout layout = MakeLayout(plan, threads);
    void* scratch = ctx.Scratch(layout.scratch);
    FUSEKIT_ENSURE(ctx, scratch != nullptr, "out of memory (%zu bytes of scratch)",
                   layout.scratch.bytes());
    const float* gamma = gamma_in.data();
    const float* beta = beta_in.data();
    const float* xs = x.data();
    float* ys = y.data();
    const int64_t item_floats = plan.positions * plan.channels;

    if (layout.per_batch) {
      // One task per batch item: statistics, combine and output back to
      // back, so the second read of x comes from this core's cache.
      const int64_t grain = std::max<int64_t>(1, kItemFloats / item_floats);
      ctx.ParallelFor(plan.batch, grain, [&](int64_t begin, int64_t end, int worker) {
        const Slot slot(plan, layout, scratch, worker);
        float* acc = layout.acc(scratch, worker);
        for (int64_t b = begin; b < end; ++b) {
          const float* xb = xs + b * item_floats;
          FillShift(plan, xb, slot);
          for (int64_t i = 0; i < plan.items; ++i) Stats(plan, xb, slot, acc, i);
          Combine(plan, slot, gamma, beta);
          Apply(plan, xb, ys + b * item_floats, slot, 0, plan.rows);
        }
      });
      return kTfLiteOk;
    }

    // Few batch items for the threads: split every batch item's rows, in
    // three phases.
    for (int64_t b = 0; b < plan.batch; ++b) {
      FillShift(plan, xs + b * item_floats, Slot(plan, layout, scratch, b));
    }
    ctx.ParallelFor(plan.batch * plan.items, 1,
                    [&](int64_t begin, int64_t end, int worker) {
                      float* acc = layout.acc(scratch, worker);
                      for (int64_t t = begin; t < end; ++t) {
                        const int64_t b = t / plan.items;
                        Stats(plan, xs + b * item_floats, Slot(plan, layout, scratch, b),
                              acc, t % plan.items);
                      }
                    });
    for (int64_t b = 0; b < plan.batch; ++b) {
      Combine(plan, Slot(plan, layout, scratch, b), gamma, beta);
    }
    ctx.ParallelFor(plan.batch * plan.items, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / plan.items, i = t % plan.items;
        const int64_t r0 = i * plan.item_rows;
        Apply(plan, xs + b * item_floats, ys + b * item_floats, Slot(plan, layout, scratch, b),
              r0, std::min(plan.rows, r0 + plan.item_rows));
      }
    });
    return kTfLiteOk;
  }

 private:
  Plan MakePlan(const Tensor& x) const {
    const int64_t batch = x.dim(0), channels = x.dim(-1);
    const int64_t positions = x.num_elements() / (batch * channels);
    return Plan(batch, positions, channels, groups_, lanes_);
  }

  // Per-batch-item tasks need one slot per worker; splitting batch items
  // needs one per batch item.  Splitting pays when the batch items do not
  // share out evenly between the threads.
  static Layout MakeLayout(const Plan& plan, int threads) {
    const bool per_batch = threads <= 1 || plan.batch >= 4 * threads ||
                           plan.batch % threads == 0 || plan.items == 1;
    return Layout(plan, threads, per_batch);
  }


  // Each channel's value at the first position, repeated across the row.
  static void FillShift(const Plan& plan, const float* xb, const Slot& slot) {
    float* shift = slot.shift;
    for (int64_t l = 0; l < plan.W; ++l) shift[l] = xb[l % plan.channels];
    for (int64_t l = plan.W; l < plan.padded; ++l) shift[l] = 0.0f;
  }

  void Stats(const Plan& plan, const float* xb, const Slot& slot, float* acc,
             int64_t item) const {
    const int64_t r0 = item * plan.item_rows;
    stats_(xb, plan.W, plan.channels, r0, std::min(plan.rows, r0 + plan.item_rows),
           plan.full_rows, plan.tail, slot.shift, acc,
           slot.partials + 2 * plan.channels * item);
  }

  // Group statistics from the items' per-channel sums, in double, then the
  // per-channel scale and offset of y = (x - shift) * scale + offset.
  void Combine(const Plan& plan, const Slot& slot, const float* gamma,
               const float* beta) const {
    const int64_t C = plan.channels;
    double* sums = slot.partials;  // item 0's partials receive the rest
    for (int64_t i = 1; i < plan.items; ++i) {
      const double* other = sums + 2 * C * i;
      for (int64_t c = 0; c < 2 * C; ++c) sums[c] += other[c];
    }
    const float* shift = slot.shift;
    float* scale = slot.scale;
    float* offset = slot.offset;
    const int64_t per_group = C / plan.groups;
    const double positions = static_cast<double>(plan.positions);
    const double count = positions * static_cast<double>(per_group);
    for (int64_t g = 0; g < plan.groups; ++g) {
      const int64_t c0 = g * per_group, c1 = c0 + per_group;
      double total = 0.0;
      for (int64_t c = c0; c < c1; ++c) total += positions * shift[c] + sums[c];
      const double mean = total / count;
      // Sum of (x - mean)^2 = sum over channels of the sums around each
      // channel's shift, moved to the mean: e = shift - mean,
      // sum (d + e)^2 = S2 + 2 e S1 + n e^2.
      double m2 = 0.0;
      for (int64_t c = c0; c < c1; ++c) {
        const double e = shift[c] - mean;
        m2 += sums[C + c] + 2.0 * e * sums[c] + positions * e * e;
      }
      const double var = std::max(m2 / count, 0.0);
      const double rstd = 1.0 / std::sqrt(var + static_cast<double>(epsilon_));
      for (int64_t c = c0; c < c1; ++c) {
        const double s = rstd * (gamma ? gamma[c] : 1.0);
        // (x - mean) * s + beta = (x - shift) * s + (shift - mean) * s + beta
        scale[c] = static_cast<float>(s);
        offset[c] = static_cast<float>((shift[c] - mean) * s + (beta ? beta[c] : 0.0));
      }
    }
    for (int64_t l = C; l < plan.W; ++l) {
      scale[l] = scale[l % C];
      offset[l] = offset[l % C];
    }
    for (int64_t l = plan.W; l < plan.padded; ++l) scale[l] = offset[l] = 0.0f;
  }

  void Apply(const Plan& plan, const float* xb, float* yb, const Slot& slot, int64_t r0,
             int64_t r1) const {
    apply_(xb, yb, plan.W, r0, r1, plan.full_rows, plan.tail, slot.shift, slot.scale,
           slot.offset);
  }

  int64_t groups_;
  float epsilon_;
  int64_t lanes_;
  StatsFn stats_;
  ApplyFn apply_;
};

}  // namespace

FUSEKIT_REGISTER_KERNEL(
    "fusekit_group_norm", GroupNorm,
    Inputs(OperandSpec("x").Rank(2, 5), OperandSpec("gamma").VectorOf("x", -1).AbsentIs(1),
           OperandSpec("beta").VectorOf("x", -1).AbsentIs(0)),
    Outputs("y"),
    AttrSchema(attr::Required(attr::Int("groups").Min(1)), attr::Float("epsilon", 1e-5).Min(0)),
    OptionsFormat(2).V1Presence("gamma", "scale").V1Presence("beta", "center"));

}  // namespace fusekit

#endif  // HWY_ONCE
