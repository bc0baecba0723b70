"""``space_to_depth``: the first strided convolution over few channels
rewritten as SPACE_TO_DEPTH plus a convolution with a smaller stride.

A CONV_2D with stride s over C channels, block b with s % b == 0:

    input [N,H,W,C] --PAD/SLICE--> [N,Lh,Lw,C] --SPACE_TO_DEPTH(b)--> [N,Lh/b,Lw/b,b*b*C]
    filter [O,KH,KW,C] --zero pad to multiples of b, rearranged--> [O,KH'/b,KW'/b,b*b*C]
    CONV_2D(VALID, stride s/b) -> the same output

The PAD reproduces SAME padding exactly (VALID: none); the SLICE drops
trailing rows/columns the original never read.  A DEPTHWISE_CONV_2D over
one channel is a convolution and is rewritten the same way; over more
channels the rewrite would need a grouped convolution and does not apply.

Whether it pays off is decided by ``should_rewrite`` (mode "auto"); "on"
rewrites wherever the transform applies.  Subgraph-level reasons for not
rewriting go into the report's notes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.model.graph import OP, OPTIONS, Graph, ModelView, copy_quantization, laid_out_by_blocks
from fusekit.passes.registry import PassOptions, register

NAME = "space_to_depth"
NOT_FIRST = "not the first convolution"

# Ops after which a convolution is no longer "the first": they compute
# features, where the few-channel waste the rewrite removes is gone.
_COMPUTE = {
    OP.CONV_2D,
    OP.DEPTHWISE_CONV_2D,
    OP.TRANSPOSE_CONV,
    OP.CONV_3D,
    OP.FULLY_CONNECTED,
    OP.BATCH_MATMUL,
    OP.CUSTOM,
}

# The cost model's limits (mode "auto").  Measured with
# benchmarks/bench_passes.py (XNNPACK, 1 thread): see docs/passes.md.
AUTO_MAX_CHANNELS = 4  # few input channels: the rewrite gives b*b*C
AUTO_MAX_BATCH = 8
AUTO_MIN_KERNEL = 3
# Measured CPU effect of the rewrite on the 7x7/2 ResNet stem over 3
# channels (rewritten / original latency; < 1 is faster), set from
# benchmarks/results/passes.json.
MEASURED_CPU_RATIO: float | None = 1.39
# A patch embedding (kernel = stride, nothing padded) is another case: it
# becomes one matrix product over k*k*C channels, with no multiply-add
# added, and XNNPACK runs that in 0.73-0.81x the time of the few-channel
# convolution for patches of 4 to 16 (benchmarks/results/passes.md).
MEASURED_PATCH_RATIO = 0.81


@dataclass
class Candidate:
    """A convolution the transform applies to, with its geometry."""

    op: schema.OperatorT
    depthwise: bool
    batch: int
    channels: int
    kernel: tuple[int, int]
    stride: int
    block: int
    # Per spatial dim: (top, bottom) padding of the input (bottom < 0: crop).
    pads: tuple[tuple[int, int], tuple[int, int]]
    padded_kernel: tuple[int, int]


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _upstream_computes(graph: Graph, tensor: int) -> bool:
    """True when a compute op (convolution, matmul, custom) is on a path
    from the subgraph's inputs to ``tensor``."""
    seen, stack = set(), [tensor]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        op = graph.producer(t)
        if op is None:
            continue
        if graph.builtin(op) in _COMPUTE:
            return True
        stack += [int(i) for i in op.inputs if i >= 0]
    return False


def candidate(graph: Graph, op: schema.OperatorT) -> tuple[Candidate | None, str]:
    """The op's geometry when the transform applies, else (None, why not)."""
    code = graph.builtin(op)
    if code not in (OP.CONV_2D, OP.DEPTHWISE_CONV_2D):
        return None, "not a convolution"
    o = op.builtinOptions
    x, w = int(op.inputs[0]), int(op.inputs[1])
    label = f"{graph.model.op_name(op)} -> {graph.name(int(op.outputs[0]))!r}"
    if o.strideH != o.strideW or o.strideH < 2:
        return None, f"{label}: stride {o.strideH}x{o.strideW} (needs equal strides >= 2)"
    if o.dilationHFactor != 1 or o.dilationWFactor != 1:
        return None, f"{label}: dilated"
    if not graph.is_constant(w):
        return None, f"{label}: weights are not a constant"
    if laid_out_by_blocks(graph.tensor(w).quantization):
        return None, f"{label}: blockwise-quantized weights"
    if len(op.inputs) > 2 and op.inputs[2] >= 0 and not graph.is_constant(int(op.inputs[2])):
        return None, f"{label}: bias is not a constant"
    signature = graph.signature(x)
    if len(signature) != 4 or any(d < 0 for d in signature[1:]):
        return None, f"{label}: input height, width and channels must be static"
    if graph.tensor(x).type != graph.tensor(w).type and graph.tensor(w).type not in (
        schema.TensorType.INT8,
    ):
        return None, f"{label}: input and weight types differ"
    if _upstream_computes(graph, x):
        return None, f"{label}: {NOT_FIRST}"
    n, h, width, c = signature
    wshape = graph.shape(w)
    if code == OP.DEPTHWISE_CONV_2D and c != 1:
        return None, f"{label}: depthwise over {c} channels needs a grouped convolution"
    kh, kw = wshape[1], wshape[2]
    s = o.strideH
    b = s  # one rewrite to stride 1 (s % b == 0)
    out_h, out_w = graph.shape(int(op.outputs[0]))[1:3]
    pads = []
    for size, k, out in ((h, kh, out_h), (width, kw, out_w)):
        if o.padding == schema.Padding.SAME:
            top = max((out - 1) * s + k - size, 0) // 2
        else:
            top = 0
        padded = (out - 1) * s + _ceil_to(k, b)
        pads.append((top, padded - size - top))
    return (
        Candidate(
            op=op,
            depthwise=code == OP.DEPTHWISE_CONV_2D,
            batch=n,
            channels=c,
            kernel=(kh, kw),
            stride=s,
            block=b,
            pads=(pads[0], pads[1]),
            padded_kernel=(_ceil_to(kh, b), _ceil_to(kw, b)),
        ),
        "",
    )


def is_patch_embedding(c: Candidate) -> bool:
    """Non-overlapping patches: kernel = stride, no padding (trailing rows
    the convolution never reads may be cut)."""
    (top_h, bottom_h), (top_w, bottom_w) = c.pads
    return (
        c.kernel == (c.stride, c.stride)
        and c.padded_kernel == c.kernel
        and top_h == top_w == 0
        and bottom_h <= 0
        and bottom_w <= 0
    )


def should_rewrite(c: Candidate) -> tuple[bool, str]:
    """The cost model of mode "auto": (rewrite?, why)."""
    if c.channels > AUTO_MAX_CHANNELS:
        return False, f"{c.channels} input channels (auto rewrites up to {AUTO_MAX_CHANNELS})"
    if c.batch < 0 or c.batch > AUTO_MAX_BATCH:
        return False, f"batch {c.batch} (auto rewrites static batches up to {AUTO_MAX_BATCH})"
    if min(c.kernel) < AUTO_MIN_KERNEL:
        return False, f"kernel {c.kernel[0]}x{c.kernel[1]} (auto needs >= {AUTO_MIN_KERNEL})"
    if is_patch_embedding(c) and MEASURED_PATCH_RATIO < 1.0:
        return True, ""
    if MEASURED_CPU_RATIO is not None and MEASURED_CPU_RATIO >= 1.0:
        macs = c.padded_kernel[0] * c.padded_kernel[1] / (c.kernel[0] * c.kernel[1])
        return False, (
            f"on CPU (XNNPACK, 1 thread) the rewrite measured {MEASURED_CPU_RATIO:.2f}x the "
            "original's latency on a 7x7/2 stem over 3 channels "
            "(benchmarks/results/passes.md); here the padded "
            f"{c.padded_kernel[0]}x{c.padded_kernel[1]} kernel also does {macs:.2f}x the "
            "multiply-adds (a patch embedding, kernel = stride, is rewritten); "
            "use space_to_depth='on' to force it"
        )
    return True, ""


def rearranged_filter(
    weights: np.ndarray, block: int, pad_value: np.ndarray | int = 0
) -> np.ndarray:
    """[O,KH,KW,C] -> [O,KH'/b,KW'/b,b*b*C]: zero-padded at the end to
    multiples of b, each b x b tap block moved into channels in
    SPACE_TO_DEPTH's order ((row * b + col) * C + c)."""
    o, kh, kw, c = weights.shape
    ph, pw = _ceil_to(kh, block), _ceil_to(kw, block)
    padded = np.empty((o, ph, pw, c), weights.dtype)
    padded[...] = (
        np.asarray(pad_value, weights.dtype).reshape(-1, 1, 1, 1)
        if np.ndim(pad_value)
        else pad_value
    )
    padded[:, :kh, :kw, :] = weights
    blocks = padded.reshape(o, ph // block, block, pw // block, block, c)
    return blocks.transpose(0, 1, 3, 2, 4, 5).reshape(
        o, ph // block, pw // block, block * block * c
    )


def _version(graph: Graph, tensor: int) -> int:
    return 2 if graph.tensor(tensor).type == schema.TensorType.INT8 else 1


def rewrite(graph: Graph, c: Candidate) -> None:
    """Applies the transform to ``c.op`` (its output tensor stays)."""
    op, b = c.op, c.block
    x, w = int(op.inputs[0]), int(op.inputs[1])
    n, h, width, ch = graph.signature(x)
    source = x
    (top, bottom), (left, right) = c.pads
    if max(top, bottom, left, right) > 0:
        shape = [n, h + top + max(bottom, 0), width + left + max(right, 0), ch]
        paddings = np.array(
            [[0, 0], [top, max(bottom, 0)], [left, max(right, 0)], [0, 0]], np.int32
        )
        padded = graph.like(x, [max(n, 1), *shape[1:]], "/s2d_pad", signature=shape)
        graph.add_op(
            OP.PAD,
            [source, graph.add_constant(paddings, graph.name(x) + "/s2d_paddings")],
            [padded],
            OPTIONS.PadOptions,
            schema.PadOptionsT(),
            version=_version(graph, x),
        )
        source, h, width = padded, shape[1], shape[2]
    if min(bottom, right) < 0:
        shape = [n, h + min(bottom, 0), width + min(right, 0), ch]
        cropped = graph.like(x, [max(n, 1), *shape[1:]], "/s2d_crop", signature=shape)
        graph.add_op(
            OP.SLICE,
            [
                source,
                graph.add_constant(np.zeros(4, np.int32), graph.name(x) + "/s2d_begin"),
                graph.add_constant(
                    np.array([-1, *shape[1:]], np.int32), graph.name(x) + "/s2d_size"
                ),
            ],
            [cropped],
            OPTIONS.SliceOptions,
            schema.SliceOptionsT(),
            version=_version(graph, x),
        )
        source, h, width = cropped, shape[1], shape[2]
    s2d_shape = [n, h // b, width // b, ch * b * b]
    s2d = graph.like(x, [max(n, 1), *s2d_shape[1:]], "/space_to_depth", signature=s2d_shape)
    options = schema.SpaceToDepthOptionsT()
    options.blockSize = b
    graph.add_op(
        OP.SPACE_TO_DEPTH,
        [source],
        [s2d],
        OPTIONS.SpaceToDepthOptions,
        options,
        version=_version(graph, x),
    )

    wt = graph.tensor(w)
    weights = graph.constant(w)
    quant = copy_quantization(wt.quantization)
    if c.depthwise:
        # [1,KH,KW,M] over one channel = a convolution with M filters.
        weights = weights.transpose(3, 1, 2, 0)
        if quant is not None and quant.scale is not None and len(quant.scale) > 1:
            quant.quantizedDimension = 0
    pad_value = 0
    if quant is not None and quant.zeroPoint is not None and len(quant.zeroPoint):
        zero = np.asarray(quant.zeroPoint)
        pad_value = zero if zero.size > 1 else int(zero[0])
    new_w = graph.add_constant(
        rearranged_filter(weights, b, pad_value), graph.name(w) + "/space_to_depth", quant, wt.type
    )
    conv = schema.Conv2DOptionsT()
    conv.padding = schema.Padding.VALID
    conv.strideH = conv.strideW = c.stride // b
    conv.fusedActivationFunction = op.builtinOptions.fusedActivationFunction
    if c.depthwise:
        version = 3 if wt.type == schema.TensorType.INT8 else 1
        op.opcodeIndex = graph.model.opcode_index(OP.CONV_2D, version)
    op.builtinOptionsType = OPTIONS.Conv2DOptions
    op.builtinOptions = conv
    graph.set_input(op, 0, s2d)
    graph.set_input(op, 1, new_w)


@register(NAME)
def space_to_depth(model: ModelView, options: PassOptions) -> tuple[ModelView, list[str]]:
    """Rewrites the first strided convolution of each subgraph where the
    mode (options.space_to_depth) and the cost model allow."""
    if options.space_to_depth == "off":
        return model, []
    changes = []
    for graph in model.graphs():
        later = 0
        for op in list(graph.ops):
            if graph.builtin(op) not in (OP.CONV_2D, OP.DEPTHWISE_CONV_2D):
                continue
            o = op.builtinOptions
            if o.strideH < 2 and o.strideW < 2:
                continue  # stride 1: nothing to do, nothing to explain
            found, why = candidate(graph, op)
            if found is None and why.endswith(NOT_FIRST):
                later += 1
            elif found is None:
                options.note(NAME, f"not applied: {why}")
            if found is None:
                continue
            if options.space_to_depth == "auto":
                ok, why = should_rewrite(found)
                if not ok:
                    options.note(NAME, f"auto declined: {why}")
                    continue
            kh, kw = found.kernel
            b, s = found.block, found.stride
            out_k = (found.padded_kernel[0] // b, found.padded_kernel[1] // b)
            rewrite(graph, found)
            changes.append(
                f"{'DEPTHWISE_CONV_2D' if found.depthwise else 'CONV_2D'} "
                f"{kh}x{kw}/{s} over {found.channels} channels -> SPACE_TO_DEPTH({b}) + "
                f"CONV_2D {out_k[0]}x{out_k[1]}/{s // b} over {found.channels * b * b} channels"
            )
        graph.finish()
        if later:
            options.note(NAME, f"{later} later strided convolution(s) left alone ({NOT_FIRST})")
    if changes:
        model.prune_buffers()
    return model, changes
