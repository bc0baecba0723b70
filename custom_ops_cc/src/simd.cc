#include "fusekit/simd.h"

#include <cstdlib>
#include <cstring>

namespace fusekit {
namespace {

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
#endif
  return SimdLevel::kBaseline;
}

SimdLevel Detect() {
  SimdLevel level = DetectCpu();
  const char* cap = std::getenv("FUSEKIT_SIMD");
  if (cap != nullptr) {
    SimdLevel wanted = level;
    if (std::strcmp(cap, "baseline") == 0) wanted = SimdLevel::kBaseline;
    if (std::strcmp(cap, "avx2") == 0) wanted = SimdLevel::kAvx2;
    if (std::strcmp(cap, "avx512") == 0) wanted = SimdLevel::kAvx512;
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
  switch (CurrentSimdLevel()) {
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx2: return "avx2";
    default: return "baseline";
  }
}

}  // namespace fusekit
