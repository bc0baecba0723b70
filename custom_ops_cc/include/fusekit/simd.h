// Runtime SIMD dispatch for kernels written with Highway.
//
// Kernels compile their per-target code with hwy/foreach_target.h and pick a
// target at run time with FUSEKIT_SIMD_CHOOSE.  fusekit does its own CPU
// check instead of Highway's HWY_DYNAMIC_DISPATCH because that needs
// libhwy's shared library at run time; this keeps every plugin
// self-contained (Highway is used header-only).
#pragma once

namespace fusekit {

enum class SimdLevel { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level this CPU supports, lowered by the environment variable
// FUSEKIT_SIMD=baseline|avx2|avx512 (for comparisons and tests).  Cached.
SimdLevel CurrentSimdLevel();
const char* SimdTargetName();

template <typename Fn>
Fn ChooseSimd(Fn baseline, Fn avx2, Fn avx512) {
  const SimdLevel level = CurrentSimdLevel();
  if (level >= SimdLevel::kAvx512 && avx512 != nullptr) return avx512;
  if (level >= SimdLevel::kAvx2 && avx2 != nullptr) return avx2;
  return baseline;
}

}  // namespace fusekit

// Use inside `#if HWY_ONCE`, in namespace fusekit, where FN was defined in
// `namespace fusekit::HWY_NAMESPACE` for every target.
#if defined(__x86_64__) && (HWY_TARGETS & HWY_AVX2) && (HWY_TARGETS & HWY_AVX3)
#define FUSEKIT_SIMD_CHOOSE(FN) \
  ::fusekit::ChooseSimd(&HWY_STATIC_DISPATCH(FN), &N_AVX2::FN, &N_AVX3::FN)
#else
#define FUSEKIT_SIMD_CHOOSE(FN) \
  ::fusekit::ChooseSimd(&HWY_STATIC_DISPATCH(FN), nullptr, nullptr)
#endif
