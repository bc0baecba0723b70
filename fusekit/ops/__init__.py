"""Ready composites with fusekit kernels (op names ``fusekit_<op>``)."""

from fusekit.ops.layer_norm import layer_norm

__all__ = ["layer_norm"]
