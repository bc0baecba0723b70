"""Ready composites with fusekit kernels (op names ``fusekit_<op>``)."""

from fusekit.ops.layer_norm import layer_norm
from fusekit.ops.rotary_embedding import rotary_embedding

__all__ = ["layer_norm", "rotary_embedding"]
