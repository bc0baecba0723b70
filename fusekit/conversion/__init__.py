"""Conversion: the plan (composites in the SavedModel's function library), the TFLite
conversion, and the check that every planned composite became a fused op."""
