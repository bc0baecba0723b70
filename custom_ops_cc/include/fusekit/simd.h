// Runtime SIMD dispatch for kernels written with Highway.
//
// Kernels compile their per-target code with hwy/foreach_target.h and pick a
// target at run time with FUSEKIT_SIMD_CHOOSE.  fusekit does its own CPU
// check instead of Highway's HWY_DYNAMIC_DISPATCH because that needs
// libhwy's shared library at run time; this keeps every plugin
// self-contained (Highway is used header-only).
#pragma once

namespace fusekit {

// SIMD levels, lowest first.  The same three steps on each architecture:
//   x86-64:  kBaseline (x86-64-v2), kAvx2, kAvx512
//   aarch64: kBaseline (NEON, which every aarch64 CPU has), kSve, kSve2
enum class SimdLevel {
  kBaseline = 0,
  kAvx2 = 1,
  kAvx512 = 2,
  kSve = 1,
  kSve2 = 2,
};

// The best level this CPU supports, lowered by the environment variable
// FUSEKIT_SIMD (x86-64: baseline|avx2|avx512; aarch64: neon|sve|sve2, with
// baseline the same as neon), for comparisons and tests.  Cached.
SimdLevel CurrentSimdLevel();
// The level's name as FUSEKIT_SIMD spells it ("neon" for aarch64's
// baseline).
const char* SimdTargetName();

template <typename Fn>
Fn ChooseSimd(Fn baseline, Fn level1, Fn level2) {
  const SimdLevel level = CurrentSimdLevel();
  if (level >= SimdLevel::kAvx512 && level2 != nullptr) return level2;
  if (level >= SimdLevel::kAvx2 && level1 != nullptr) return level1;
  return baseline;
}

}  // namespace fusekit

// Use inside `#if HWY_ONCE`, in namespace fusekit, where FN was defined in
// `namespace fusekit::HWY_NAMESPACE` for every target of
// fusekit/simd_targets.h.  A build with fewer targets (another compiler,
// another HWY_DISABLED_TARGETS) runs its static target at every level.
#if HWY_ARCH_X86_64 && (HWY_TARGETS & HWY_AVX2) && (HWY_TARGETS & HWY_AVX3)
#define FUSEKIT_SIMD_CHOOSE(FN) \
  ::fusekit::ChooseSimd(&HWY_STATIC_DISPATCH(FN), &N_AVX2::FN, &N_AVX3::FN)
#elif HWY_ARCH_ARM_A64 && (HWY_TARGETS & HWY_SVE) && (HWY_TARGETS & HWY_SVE2)
#define FUSEKIT_SIMD_CHOOSE(FN) \
  ::fusekit::ChooseSimd(&HWY_STATIC_DISPATCH(FN), &N_SVE::FN, &N_SVE2::FN)
#else
#define FUSEKIT_SIMD_CHOOSE(FN)                                     \
  ::fusekit::ChooseSimd<decltype(&HWY_STATIC_DISPATCH(FN))>(        \
      &HWY_STATIC_DISPATCH(FN), nullptr, nullptr)
#endif
