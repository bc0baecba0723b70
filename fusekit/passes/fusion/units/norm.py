"""What the three norm units share: the emitter of a proven norm
(fusion/norms.py finds them) as its library op, and the notes a fused norm
without its own gamma or beta carries."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph
from fusekit.passes.fusion.emit import replace_with_custom
from fusekit.passes.fusion.norms import NormMatch, find_norms
from fusekit.passes.fusion.pattern import Fusion
from fusekit.passes.fusion.quantized import QUANTIZED_NORM
from fusekit.passes.fusion.shared_rules import finish, operand_list


def vector_view(graph: Graph, tensor: int) -> int:
    """``tensor`` as a rank-1 tensor: itself when it already is one; else a
    tensor of shape [n] over the same constant buffer (for DEQUANTIZE of a
    float16 constant, a view of the float16 constant and a new DEQUANTIZE)."""
    shape = graph.shape(tensor)
    if len(shape) <= 1:
        return tensor
    size = int(np.prod(shape))
    if graph.is_constant(tensor):
        t = graph.tensor(tensor)
        return graph.add_tensor([size], t.type, graph.name(tensor) + "/vector", buffer=t.buffer)
    dequantize = graph.producer(tensor)
    assert dequantize is not None and graph.builtin(dequantize) == OP.DEQUANTIZE
    source = int(dequantize.inputs[0])
    t = graph.tensor(source)
    half = graph.add_tensor([size], t.type, graph.name(source) + "/vector", buffer=t.buffer)
    out = graph.add_tensor([size], graph.tensor(tensor).type, graph.name(tensor) + "/vector")
    graph.add_op(OP.DEQUANTIZE, [half], [out])
    return out


# Why a norm fused without its own beta (gamma): the model applies none
# after it.  The converter either folded the layer's gamma/beta into the
# layers reading the norm (their weights and bias) or dropped a multiply by
# ones / an add of zeros; the graph cannot tell which, and both compute the
# same values.  When some readers still apply them, those ops stay.
_NO_AFFINE = {"center": ("beta", "an add of zeros"), "scale": ("gamma", "a multiply by ones")}


def affine_note(op: str, where: str, attr: str, applied_after: bool) -> str:
    """The note of a fused norm without its ``attr`` ("center"/"scale")."""
    name, neutral = _NO_AFFINE[attr]
    if applied_after:
        return (
            f"{op} at {where!r} fused with {attr}=False: the converter applied the layer's "
            f"{name} in the ops that read the norm (for some readers folded into their "
            f"weights), so the fused op writes the normalized values once and those ops "
            f"apply the {name}; every reader sees the values it saw before"
        )
    return (
        f"{op} at {where!r} fused with {attr}=False: the model applies no {name} after it "
        f"(the converter folded it into the layers reading the norm, or dropped {neutral}); "
        "the fused op computes the values the model did"
    )


class NormUnit(Fusion[NormMatch]):
    """A norm of one ``kind`` found by fusion/norms.py's polynomial proof;
    the unit modules (layer_norm, rms_norm, group_norm) name the kind and
    the op's attrs."""

    #: "layer_norm", "rms_norm" or "group_norm".
    kind = ""
    #: The model says nothing of affine operands (RMS norms always scale).
    has_affine = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # One name per kind: the op fusekit_<kind>, the pass fuse_<kind>.
        cls.op = f"fusekit_{cls.kind}"
        cls.pass_name = f"fuse_{cls.kind}"

    def attrs(self, match: NormMatch) -> dict[str, float | int]:
        """The op's attrs for ``match``."""
        return {"epsilon": match.epsilon}

    def find(self, graph: Graph, near_misses: list[str]) -> list[NormMatch]:
        return find_norms(graph, self.kind, near_misses)

    def drop_note(self, note: str, passes: tuple[str, ...]) -> bool:
        # With fuse_quantized in the run, it fused the quantized norm or its
        # own note says why not.
        return "fuse_quantized" in passes and note.endswith(QUANTIZED_NORM)

    def rewrite(self, graph: Graph, match: NormMatch) -> str:
        axis = -1 if match.transpose_in is None else match.transpose_in[-1]
        depth = graph.signature(match.x)[axis]

        def ones(name: str) -> int:
            value = np.ones(depth, np.float32)
            return graph.add_constant(value, f"{graph.name(match.output)}/{name}_ones")

        given = {"x": match.x, "gamma": None, "beta": None}
        if match.gamma is not None:
            given["gamma"] = vector_view(graph, match.gamma)
        if match.beta is not None:
            given["beta"] = vector_view(graph, match.beta)
        inputs = operand_list(graph, self.op, given, ones)
        attrs = self.attrs(match)
        _emit(graph, self.op, inputs, attrs, match)
        shown = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in attrs.items()
        )
        where = graph.name(match.output)
        if self.has_affine and (match.gamma is None or match.beta is None):
            # As Keras names the missing operands.
            shown += f", scale={match.gamma is not None}, center={match.beta is not None}"
            for attr, present in (("scale", match.gamma), ("center", match.beta)):
                if present is None:
                    self.notes.append(affine_note(self.op, where, attr, match.affine_after))
        if match.transpose_in is not None:
            shown += f", normalized axis moved last by a transpose pair {match.transpose_in}"
        return f"{self.op} at {where!r} ({len(match.ops)} ops; {shown})"

    def finish(self, graph: Graph) -> None:
        finish(graph)


def _emit(graph: Graph, op: str, inputs: list[int], attrs: dict, match: NormMatch) -> None:
    """The op in place of ``match.ops``, writing ``match.output`` (through
    the transposes and reshape readers the match asks for)."""
    output = match.output
    if match.readers:
        output = graph.like(
            output, graph.shape(match.x), "/ungrouped", signature=graph.signature(match.x)
        )
    if match.transpose_in is not None:
        # The normalized axis is not x's last (or x is channels-first): the
        # op reads x with it moved last (data movement only).
        inputs = [graph.add_transpose(match.x, match.transpose_in), *inputs[1:]]
    if match.transpose_back is not None or match.reshape_to is not None:
        # The op writes the moved layout; the matched result keeps x's (or
        # is a reshape of the op's).
        fused = graph.like(
            output, graph.shape(inputs[0]), "/axis_last", signature=graph.signature(inputs[0])
        )
        replace_with_custom(graph, op, inputs, fused, attrs, match.ops)
        if match.transpose_back is not None:
            graph.add_transpose(fused, match.transpose_back, output=output)
        else:
            _reshape_into(graph, fused, output)
    else:
        replace_with_custom(graph, op, inputs, output, attrs, match.ops)
    for reader in match.readers:
        graph.set_input(reader, 0, output)


def _reshape_into(graph: Graph, source: int, output: int) -> None:
    """RESHAPE(source) into ``output``, to its static shape."""
    shape = graph.signature(output)
    new_shape = graph.add_constant(np.array(shape, np.int32), graph.name(output) + "/shape")
    options = schema.ReshapeOptionsT()
    options.newShape = list(shape)
    graph.add_op(OP.RESHAPE, [source, new_shape], [output], OPTIONS.ReshapeOptions, options)
