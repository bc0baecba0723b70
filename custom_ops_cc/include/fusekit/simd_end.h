// Closes what fusekit/simd_begin.h opened (see there).  No include guard:
// re-included once per SIMD target.
}  // namespace HWY_NAMESPACE
}  // namespace fusekit
HWY_AFTER_NAMESPACE();
