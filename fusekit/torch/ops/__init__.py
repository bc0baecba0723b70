"""fusekit's ready ops for PyTorch: the same fused ops (names, attrs,
kernels) as ``fusekit.ops``, marked in a torch model.

Each function computes its op in torch (the reference); exported with
litert-torch each call is one composite ``fusekit.<op>`` that
``fusekit.optimize`` replaces by the op (``fusekit_rms_norm``, ...) once
fusekit's kernel and the composite's body agree on its shapes.
"""

from fusekit.torch.ops.attention import attention
from fusekit.torch.ops.norms import group_norm, layer_norm, rms_norm
from fusekit.torch.ops.rotary_embedding import rotary_embedding

__all__ = ["attention", "group_norm", "layer_norm", "rms_norm", "rotary_embedding"]
