#include "fusekit/simd.h"

#include <cstdlib>
#include <cstring>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace fusekit {
namespace {

#if defined(__aarch64__)
// Kernel-reported feature bits (linux/arch/arm64/include/uapi/asm/hwcap.h);
// spelled out because older libc headers lack the HWCAP2 ones.
constexpr unsigned long kHwcapAsimd = 1UL << 1;  // NEON
constexpr unsigned long kHwcapSve = 1UL << 22;
constexpr unsigned long kHwcap2Sve2 = 1UL << 1;
#endif

SimdLevel DetectCpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // Highway's AVX2 target also relies on FMA, BMI2 and F16C; its AVX3 target
  // on AVX-512 F/BW/DQ/VL.
  const bool avx2 = __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  if (avx512) return SimdLevel::kAvx512;
  if (avx2) return SimdLevel::kAvx2;
#elif defined(__aarch64__) && defined(__linux__)
  // The kernel tells which extensions it enables for user space (SVE also
  // needs the kernel's support to save the wider registers).  Highway's
  // SVE2 target is compiled with +sve2-aes, but fusekit's kernels use no
  // AES instruction, so SVE2 alone is enough.
  const unsigned long hwcap = getauxval(AT_HWCAP);
  const unsigned long hwcap2 = getauxval(AT_HWCAP2);
  const bool sve = (hwcap & kHwcapAsimd) && (hwcap & kHwcapSve);
  if (sve && (hwcap2 & kHwcap2Sve2)) return SimdLevel::kSve2;
  if (sve) return SimdLevel::kSve;
#endif
  return SimdLevel::kBaseline;
}

// FUSEKIT_SIMD's value as a level of this architecture; `fallback` for
// names of the other one (or typos): the variable then changes nothing.
SimdLevel Requested(const char* name, SimdLevel fallback) {
  if (std::strcmp(name, "baseline") == 0) return SimdLevel::kBaseline;
#if defined(__aarch64__)
  if (std::strcmp(name, "neon") == 0) return SimdLevel::kBaseline;
  if (std::strcmp(name, "sve") == 0) return SimdLevel::kSve;
  if (std::strcmp(name, "sve2") == 0) return SimdLevel::kSve2;
#else
  if (std::strcmp(name, "avx2") == 0) return SimdLevel::kAvx2;
  if (std::strcmp(name, "avx512") == 0) return SimdLevel::kAvx512;
#endif
  return fallback;
}

SimdLevel Detect() {
  SimdLevel level = DetectCpu();
  const char* cap = std::getenv("FUSEKIT_SIMD");
  if (cap != nullptr) {
    const SimdLevel wanted = Requested(cap, level);
    // The variable can only lower the level: asking for more than the CPU
    // has would crash.
    if (wanted < level) level = wanted;
  }
  return level;
}

}  // namespace

SimdLevel CurrentSimdLevel() {
  static const SimdLevel level = Detect();
  return level;
}

const char* SimdTargetName() {
#if defined(__aarch64__)
  switch (CurrentSimdLevel()) {
    case SimdLevel::kSve2: return "sve2";
    case SimdLevel::kSve: return "sve";
    default: return "neon";
  }
#else
  switch (CurrentSimdLevel()) {
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx2: return "avx2";
    default: return "baseline";
  }
#endif
}

}  // namespace fusekit
