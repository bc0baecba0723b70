"""A copy of a SavedModel whose composites are no longer fusable.

The converter inlines an ``experimental_implements`` function without
``tfl_fusable_op`` into builtins, so dropping that attr from the saved
function library yields the unfused baseline of the very same graph, with
no re-tracing.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def unfused_copy(saved_model_dir: str, target: Path) -> int:
    """Writes the copy to ``target``; returns how many functions changed."""
    from tensorflow.core.protobuf import saved_model_pb2

    source = Path(saved_model_dir)
    shutil.copytree(source, target)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((source / "saved_model.pb").read_bytes())
    changed = 0
    for meta_graph in proto.meta_graphs:
        for function in meta_graph.graph_def.library.function:
            implements = function.attr.get("_implements")
            if implements is not None and "tfl_fusable_op" in implements.func.attr:
                del implements.func.attr["tfl_fusable_op"]
                changed += 1
    (target / "saved_model.pb").write_bytes(proto.SerializeToString())
    return changed
