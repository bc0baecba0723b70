"""Conversion: the plan (composites in the imported MLIR), the TFLite
conversion, and the check that every planned composite became a fused op."""
