"""Ready composites with fusekit kernels (op names ``fusekit_<op>``)."""

from fusekit.ops.attention import attention
from fusekit.ops.group_norm import group_norm
from fusekit.ops.layer_norm import layer_norm
from fusekit.ops.rms_norm import rms_norm
from fusekit.ops.rotary_embedding import rotary_embedding

__all__ = ["attention", "group_norm", "layer_norm", "rms_norm", "rotary_embedding"]
