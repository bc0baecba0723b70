// fusekit_attention's storage types (per SIMD target): q, k, v and out are
// float32 or float16; every computation is float32.  Loads promote, stores
// demote.
// Included inside namespace fusekit::HWY_NAMESPACE, after
// fusekit/simd_begin.h (Highway's per-target include guard: no #pragma
// once, re-included for every SIMD target).

#if defined(FUSEKIT_KERNELS_ATTENTION_F16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_KERNELS_ATTENTION_F16_INL_H_
#undef FUSEKIT_KERNELS_ATTENTION_F16_INL_H_
#else
#define FUSEKIT_KERNELS_ATTENTION_F16_INL_H_
#endif

namespace att = ::fusekit::attention;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// ------------------------------------------------------ storage types
//
// q, k, v and out are float or F16 (raw IEEE half bits, as
// fusekit::Half); every computation is float32.  A vector of DF's lanes
// is loaded from either as float32 and stored back to either.

using F16 = hwy::float16_t;
using DH = hn::Rebind<F16, DF>;  // as many halves as DF has floats

// float16 lanes to float32.  AVX2 and AVX-512 use the F16C instruction
// through Highway.  On the baseline target (no F16C) Highway 1.0's
// emulation turns infinities and NaNs into finite numbers, so the
// conversion is done here, exactly (subnormals, inf and NaN included).
HWY_INLINE VF PromoteHalf(DF d, hn::Vec<DH> h) {
#if HWY_TARGET >= HWY_SSE4 || defined(HWY_DISABLE_F16C)
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(),
                                                  hn::BitCast(du16, h)));
  const auto shifted_exp = hn::Set(di, 0x7c00 << 13);
  auto o = hn::ShiftLeft<13>(hn::And(bits, hn::Set(di, 0x7fff)));
  const auto exp = hn::And(o, shifted_exp);
  o = hn::Add(o, hn::Set(di, (127 - 15) << 23));  // rebias the exponent
  // inf / NaN: the exponent goes to 255.
  o = hn::IfThenElse(hn::Eq(exp, shifted_exp), hn::Add(o, hn::Set(di, (128 - 16) << 23)), o);
  // Zero / subnormal: renormalized by a float subtraction of 2^-14.
  const auto sub = hn::BitCast(
      di, hn::Sub(hn::BitCast(d, hn::Add(o, hn::Set(di, 1 << 23))),
                  hn::BitCast(d, hn::Set(di, 113 << 23))));
  o = hn::IfThenElse(hn::Eq(exp, hn::Zero(di)), sub, o);
  o = hn::Or(o, hn::ShiftLeft<16>(hn::And(bits, hn::Set(di, 0x8000))));
  return hn::BitCast(d, o);
#else
  return hn::PromoteTo(d, h);
#endif
}

// float32 lanes to float16, rounded to nearest even (TensorFlow's cast).
// Highway 1.0's baseline emulation truncates instead, hence the own code
// there; overflow gives inf, NaN stays NaN.
HWY_INLINE hn::Vec<DH> DemoteHalf(DF d, VF v) {
#if HWY_TARGET >= HWY_SSE4 || defined(HWY_DISABLE_F16C)
  (void)d;
  const hn::RebindToSigned<DF> di;
  const auto raw = hn::BitCast(di, v);
  const auto sign = hn::And(raw, hn::Set(di, static_cast<int32_t>(0x80000000u)));
  const auto f = hn::Xor(raw, sign);  // |v|, as bits
  // Too large for a half (or inf / NaN).
  const auto special = hn::IfThenElse(hn::Gt(f, hn::Set(di, 0x7f800000)),
                                      hn::Set(di, 0x7e00), hn::Set(di, 0x7c00));
  // Subnormal halves: adding 0.5f rounds the mantissa at the right place.
  const auto sub = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(d, f), hn::Set(d, 0.5f))),
                           hn::Set(di, 126 << 23));
  // Normal: rebias, round to nearest even, drop 13 mantissa bits.
  const auto odd = hn::And(hn::ShiftRight<13>(f), hn::Set(di, 1));
  const auto normal = hn::ShiftRight<13>(
      hn::Add(hn::Add(f, hn::Set(di, -((127 - 15) << 23) + 0xfff)), odd));
  auto o = hn::IfThenElse(hn::Lt(f, hn::Set(di, 113 << 23)), sub, normal);
  o = hn::IfThenElse(hn::Lt(f, hn::Set(di, (127 + 16) << 23)), o, special);
  const hn::RebindToUnsigned<DF> du;
  o = hn::Or(o, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, sign))));
  return hn::BitCast(DH(), hn::DemoteTo(hn::Rebind<uint16_t, DF>(), o));
#else
  return hn::DemoteTo(DH(), v);
#endif
}

// A vector (LoadF / StoreF) or the first `count` lanes (LoadTailF /
// StoreTailF, which touch no element past them) of storage type T.
HWY_INLINE VF LoadF(DF d, const float* HWY_RESTRICT p) { return hn::LoadU(d, p); }
HWY_INLINE VF LoadF(DF d, const F16* HWY_RESTRICT p) {
  return PromoteHalf(d, hn::LoadU(DH(), p));
}
HWY_INLINE VF LoadTailF(DF d, const float* HWY_RESTRICT p, size_t count) {
  return LoadTail(d, p, count);
}
HWY_INLINE VF LoadTailF(DF d, const F16* HWY_RESTRICT p, size_t count) {
  // Through a buffer: AVX2 has no masked 16-bit load (Highway's MaskedLoad
  // there reads the whole vector).
  HWY_ALIGN F16 buffer[hn::MaxLanes(DH())] = {};
  std::memcpy(buffer, p, count * sizeof(F16));
  return PromoteHalf(d, hn::Load(DH(), buffer));
}
HWY_INLINE void StoreF(VF v, DF d, float* HWY_RESTRICT p) { hn::StoreU(v, d, p); }
HWY_INLINE void StoreF(VF v, DF d, F16* HWY_RESTRICT p) {
  hn::StoreU(DemoteHalf(d, v), DH(), p);
}
HWY_INLINE void StoreTailF(VF v, DF d, float* HWY_RESTRICT p, size_t count) {
  StoreTail(v, d, p, count);
}
HWY_INLINE void StoreTailF(VF v, DF d, F16* HWY_RESTRICT p, size_t count) {
  HWY_ALIGN F16 buffer[hn::MaxLanes(DH())];
  hn::Store(DemoteHalf(d, v), DH(), buffer);
  std::memcpy(p, buffer, count * sizeof(F16));
}

// dst[0, n) = src[0, n) * factor, from storage type S to storage type D.
template <typename S, typename D>
HWY_INLINE void ConvertRow(const S* HWY_RESTRICT src, int64_t n, float factor,
                           D* HWY_RESTRICT dst) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF f = hn::Set(d, factor);
  int64_t c = 0;
  for (; c + lanes <= n; c += lanes) StoreF(hn::Mul(LoadF(d, src + c), f), d, dst + c);
  if (c < n) {
    const size_t rest = static_cast<size_t>(n - c);
    StoreTailF(hn::Mul(LoadTailF(d, src + c, rest), f), d, dst + c, rest);
  }
}

// n rows of `cols` elements, src rows src_stride apart, to float32 rows
// dst_stride apart.
template <typename T>
HWY_INLINE void ConvertRows(const T* HWY_RESTRICT src, int64_t src_stride, int64_t n,
                            int64_t cols, float* HWY_RESTRICT dst, int64_t dst_stride) {
  for (int64_t j = 0; j < n; ++j) {
    ConvertRow(src + j * src_stride, cols, 1.0f, dst + j * dst_stride);
  }
}

#endif  // FUSEKIT_KERNELS_ATTENTION_F16_INL_H_
