"""Graph passes over .tflite models (conversion side).

``fusekit.optimize(model, passes=[...])`` runs them on any .tflite;
``fusekit.convert(..., passes=[...])`` runs them after conversion.  Built-in
passes: ``cleanup``, ``fold_constants`` (what the graph computes from
constants only, computed once), ``fuse_composites`` (litert-torch's StableHLO composites),
``fuse_quantized`` (int8 regions), ``fuse`` (``fuse_group_norm``, ``fuse_layer_norm``,
``fuse_rms_norm``, ``fuse_rotary``, ``fuse_attention``), ``layout``,
``reshapes``, ``fold_affine``, ``space_to_depth``; opt-in: ``kv_cache_in_place``
(a functional KV cache
updated in place, see ``fusekit/passes/kv_cache.py``).  Your own::

    @fusekit.passes.register("my_pass")
    def my_pass(model: fusekit.passes.ModelView, options) -> tuple[ModelView, list[str]]:
        for graph in model.graphs():
            ...                      # edit through the Graph view
            graph.finish()
        return model, ["what changed"]   # [] when nothing did
"""

from __future__ import annotations

from fusekit.errors import PassError
from fusekit.model.graph import Graph, ModelView
from fusekit.passes import (  # noqa: F401 - register the built-ins
    cleanup,
    fold_affine,
    fold_constants,
    fuse,
    fuse_composites,
    fuse_quantized,
    kv_cache,
    layout,
    reshapes,
    space_to_depth,
)
from fusekit.passes.pipeline import (
    DEFAULT_PASSES,
    OptimizeResult,
    PassLine,
    PassReport,
    optimize,
    run_passes,
)
from fusekit.passes.registry import PassOptions, available, get, register, unregister

__all__ = [
    "DEFAULT_PASSES",
    "Graph",
    "ModelView",
    "OptimizeResult",
    "PassError",
    "PassLine",
    "PassOptions",
    "PassReport",
    "available",
    "get",
    "optimize",
    "register",
    "run_passes",
    "unregister",
]
