"""``fuse``: every pattern-fusion pass in one (group norms, layer norms, RMS
norms, rotary embeddings, attention), reporting under one name; in the default passes of
``fusekit optimize``."""

from __future__ import annotations

from fusekit.model.graph import ModelView
from fusekit.passes.fusion.norm_notes import note_unfused_norms
from fusekit.passes.fusion.quantized import BY_FUSE_QUANTIZED, leftover_notes
from fusekit.passes.fusion.rewrite import (
    fuse_attention_pass,
    fuse_norm_pass,
    fuse_rotary_pass,
)
from fusekit.passes.registry import PassOptions, register
from fusekit.run.op_spec import op_spec

NAME = "fuse"


@register(NAME)
def fuse(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Group norms first (their statistics over [B, G, C/G] would otherwise
    look like a layer norm's), then layer norms (an RMS norm of a centered x
    would otherwise match inside them), then RMS norms, rotary embeddings (before attention: they
    sit on its q and k) and attention."""
    before = _without_affine(model)
    changes = fuse_norm_pass(model, options, "group_norm", NAME)
    changes += fuse_norm_pass(model, options, "layer_norm", NAME)
    for key, (op, missing, _) in _without_affine(model).items():
        if key not in before:
            for attr in missing:
                options.note(NAME, _WHY_NO_AFFINE[attr].format(op=op))
    changes += fuse_norm_pass(model, options, "rms_norm", NAME)
    note_unfused_norms(model, options, NAME)
    changes += fuse_rotary_pass(model, options, NAME)
    changes += fuse_attention_pass(model, options, NAME)
    # With fuse_quantized in the run, its notes say why it left a quantized
    # rotary or attention ("fuse_quantized fuses it" would be wrong).
    if "fuse_quantized" not in options.passes:
        for graph in model.graphs():
            for message in leftover_notes(graph, BY_FUSE_QUANTIZED):
                options.note(NAME, message)
    return model, changes


# Why a norm fused without its beta (or gamma) when the source model's
# layer had one: the converter folds an ADD of zeros (a MUL by ones) away,
# so a freshly initialized layer's beta leaves no trace in the .tflite.
_WHY_NO_AFFINE = {
    "center": "{op} fused with center=False: the model adds no beta after it. The TFLite "
    "converter folds away an add of zeros, so a layer whose beta is still all zeros "
    "(initialized, not trained) converts without one; the fused op computes the same "
    "values, and a trained model's nonzero beta fuses as center=True",
    "scale": "{op} fused with scale=False: the model multiplies by no gamma after it. "
    "The TFLite converter folds away a multiply by ones, so a layer whose gamma is still "
    "all ones (initialized, not trained) converts without one; the fused op computes the "
    "same values, and a trained model's gamma fuses as scale=True",
}


def _without_affine(model: ModelView) -> dict[int, tuple[str, list[str], object]]:
    """Fused layer and group norms without beta or gamma (absent inputs):
    id(op) -> (op name, ["center"] / ["scale"] / both, the operator, held
    so that its id is not reused)."""
    found = {}
    for graph in model.graphs():
        for op in graph.ops:
            name = model.op_name(op).removeprefix("CUSTOM:")
            if name not in ("fusekit_layer_norm", "fusekit_group_norm"):
                continue
            inputs = [int(t) for t in op.inputs]
            # As Keras names the operands: gamma is scale, beta center.
            flags = dict(op_spec(name).v1_presence)
            names = [o.name for o in op_spec(name).inputs]
            missing = [
                flags[n]
                for i, n in enumerate(names)
                if n in flags and (i >= len(inputs) or inputs[i] < 0)
            ]
            if missing:
                found[id(op)] = (name, sorted(missing), op)
    return found
