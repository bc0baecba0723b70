// Opens a kernel's per-SIMD-target code: the Highway boilerplate every
// kernel source needs, written once.  A kernel compiled for each target of
// fusekit/simd_targets.h reads:
//
//   #include <cstdint>  // standard headers first, outside the namespaces
//   #undef HWY_TARGET_INCLUDE
//   #define HWY_TARGET_INCLUDE "kernels/my_kernel.cc"  // this file's own path
//   #include "fusekit/simd_begin.h"
//
//   // Per target, in namespace fusekit::HWY_NAMESPACE, with
//   // hn = hwy::HWY_NAMESPACE and LoadTail / StoreTail (fusekit/simd_tail.h):
//   void MyRows(const float* x, float* y, int64_t n) { ... }
//
//   #include "fusekit/simd_end.h"
//
//   #if HWY_ONCE
//   // Compiled once: the kernel class, FUSEKIT_SIMD_CHOOSE(MyRows)
//   // (fusekit/simd.h) and FUSEKIT_REGISTER_KERNEL.
//   #endif
//
// hwy/foreach_target.h re-includes the source, and with it this header,
// once per target: no include guard.
#ifndef HWY_TARGET_INCLUDE
#error "#define HWY_TARGET_INCLUDE as the kernel source's own path before fusekit/simd_begin.h"
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// A source that #defines FUSEKIT_SIMD_MATH first also gets Highway's vector
// math (hn::Exp, hn::Tanh, ...), which must be included here, outside the
// namespaces.
#ifdef FUSEKIT_SIMD_MATH
#include "hwy/contrib/math/math-inl.h"
#endif

HWY_BEFORE_NAMESPACE();
namespace fusekit {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#include "fusekit/simd_tail.h"
