"""Shared machinery of the pattern-fusion passes (``fuse_*``): emitting the
library's custom ops, reading constants through DEQUANTIZE, and proving a
matched region computes the fused op (see docs/passes.md)."""
