"""Runtime side: loads fusekit's kernels into TFLite interpreters.

Nothing here imports TensorFlow (``runtime="tf"`` imports it on request).
"""
