"""Runtime side: loads fusekit's kernels into TFLite interpreters.

Nothing here imports TensorFlow (``runtime="tf"`` imports it on request).
"""

# The README's path to the model listing (``fusekit.run.model_ops``), which
# ``import fusekit`` makes reachable as an attribute.
from fusekit.run import model_ops  # noqa: F401
