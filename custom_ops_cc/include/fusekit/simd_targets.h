// The Highway targets fusekit's kernels are compiled for: the one place
// that lists them.  Force-included (-include fusekit/simd_targets.h) ahead
// of every translation unit, by CMakeLists.txt for the library and by
// fusekit.build_plugin for users' plugins, because Highway reads the
// setting when its first header is included.
//
//   x86-64:  the baseline (SSSE3 under -march=x86-64-v2), AVX2, AVX-512
//   aarch64: NEON (every aarch64 CPU), SVE and SVE2 at any vector length
//
// fusekit/simd.h dispatches over exactly these; the other targets are left
// out to keep compile time and library size down: SSE4 (within 5% of the
// baseline), AVX3_DL (no kernel uses its instructions), and SVE_256 /
// SVE2_128, Highway's fixed-length variants of SVE and SVE2 (the scalable
// code runs on those CPUs as it is).
#pragma once

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSE4 | HWY_AVX3_DL | HWY_SVE_256 | HWY_SVE2_128)
#endif
