"""The space-to-depth pass: a 7x7 stride-2 stem over 3 channels becomes
SPACE_TO_DEPTH + a stride-1 convolution over 12 channels with the same
outputs; SAME and VALID padding exact; the cost model's decisions."""

from __future__ import annotations

import numpy as np
import pytest
from pass_models import convert_tf, count, random_inputs, representative, run, stem

import fusekit
from fusekit.model.graph import OP
from fusekit.passes import ModelView


def conv_geometry(model: bytes) -> list[tuple[str, list[int], list[int], int]]:
    """(op, input shape, filter shape, stride) of every convolution."""
    view = ModelView(model)
    graph = next(view.graphs())
    out = []
    for op in graph.ops:
        if graph.builtin(op) in (OP.CONV_2D, OP.DEPTHWISE_CONV_2D):
            out.append(
                (
                    view.op_name(op),
                    graph.shape(int(op.inputs[0])),
                    graph.shape(int(op.inputs[1])),
                    op.builtinOptions.strideH,
                )
            )
    return out


def assert_same(a: bytes, b: bytes, atol: float = 1e-4) -> None:
    inputs = random_inputs(a)
    for x, y in zip(run(a, inputs), run(b, inputs), strict=True):
        assert x.shape == y.shape
        np.testing.assert_allclose(y, x, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def resnet_stem() -> bytes:
    return convert_tf(stem(size=224))


def test_resnet_stem_becomes_a_stride_1_conv_over_12_channels(resnet_stem):
    result = fusekit.optimize(resnet_stem, passes=["space_to_depth"], space_to_depth="on")
    assert conv_geometry(resnet_stem) == [("CONV_2D", [1, 224, 224, 3], [64, 7, 7, 3], 2)]
    assert conv_geometry(result.model) == [("CONV_2D", [1, 115, 115, 12], [64, 4, 4, 12], 1)]
    assert count(result.model, "SPACE_TO_DEPTH") == 1
    assert_same(resnet_stem, result.model, atol=1e-4)
    (change,) = result.report.line("space_to_depth").changes
    assert "7x7/2 over 3 channels" in change and "4x4/1 over 12 channels" in change
    again = fusekit.optimize(result.model, passes=["space_to_depth"], space_to_depth="on")
    assert again.model is result.model  # idempotent


def test_auto_declines_on_cpu_and_says_why(resnet_stem):
    result = fusekit.optimize(resnet_stem, passes=["space_to_depth"])
    assert result.model is resnet_stem
    (note,) = result.report.line("space_to_depth").notes
    assert note.startswith("auto declined: on CPU (XNNPACK, 1 thread) the rewrite measured")
    assert "auto declined" in result.report.to_text()
    off = fusekit.optimize(resnet_stem, passes=["space_to_depth"], space_to_depth="off")
    assert off.model is resnet_stem and off.report.passes == []


@pytest.mark.parametrize(
    "size,kernel,stride,padding",
    [
        (33, 7, 2, "VALID"),  # kernel padded to 8, input padded at the end
        (32, 4, 2, "VALID"),  # last row/col never read: cropped (SLICE)
        (33, 4, 2, "VALID"),
        (31, 3, 2, "SAME"),
        (30, 5, 2, "SAME"),
        (32, 8, 4, "SAME"),  # stride 4: block 4, 48 channels
        (29, 6, 3, "SAME"),
    ],
)
def test_padding_is_exact(size, kernel, stride, padding):
    model = convert_tf(stem(size=size, kernel=kernel, stride=stride, padding=padding, filters=8))
    result = fusekit.optimize(model, passes=["space_to_depth"], space_to_depth="on")
    ((_, shape, filters, new_stride),) = conv_geometry(result.model)
    assert new_stride == 1 and shape[3] == 3 * stride * stride
    assert filters[1] == -(-kernel // stride)
    assert_same(model, result.model, atol=1e-5)


def test_depthwise_over_one_channel_becomes_a_convolution():
    model = convert_tf(
        stem(size=29, channels=1, filters=4, kernel=5, padding="VALID", depthwise=True)
    )
    result = fusekit.optimize(model, passes=["space_to_depth"], space_to_depth="on")
    assert conv_geometry(result.model) == [("CONV_2D", [1, 15, 15, 4], [4, 3, 3, 4], 1)]
    assert_same(model, result.model, atol=1e-5)


def test_int8_stem_with_per_channel_weights():
    model = convert_tf(stem(size=32, filters=8), representative([1, 32, 32, 3]))
    result = fusekit.optimize(model, passes=["space_to_depth"], space_to_depth="on")
    ((_, shape, filters, stride),) = conv_geometry(result.model)
    assert (shape[3], filters[1:], stride) == (12, [4, 4, 12], 1)
    graph = next(ModelView(result.model).graphs())
    conv = [op for op in graph.ops if graph.builtin(op) == OP.CONV_2D][0]
    q = graph.tensor(int(conv.inputs[1])).quantization
    assert len(q.scale) == 8 and q.quantizedDimension == 0
    # Same int8 products summed in another order: identical int32 sums.
    assert_same(model, result.model, atol=0)


def test_does_not_fire_where_it_does_not_apply():
    # Depthwise over 3 channels would need a grouped convolution.
    model = convert_tf(stem(size=16, channels=3, filters=3, kernel=3, depthwise=True))
    result = fusekit.optimize(model, passes=["space_to_depth"], space_to_depth="on")
    assert result.model is model
    assert "grouped convolution" in result.report.line("space_to_depth").notes[0]
    # Stride 1: nothing to do.
    model = convert_tf(stem(size=16, stride=1, kernel=3))
    assert fusekit.optimize(model, passes=["space_to_depth"], space_to_depth="on").model is model


def test_auto_cost_model_limits():
    from fusekit.passes import space_to_depth as s2d

    base = dict(op=None, depthwise=False, stride=2, block=2, pads=((0, 0), (0, 0)))
    many = s2d.Candidate(batch=1, channels=16, kernel=(7, 7), padded_kernel=(8, 8), **base)
    assert s2d.should_rewrite(many) == (False, "16 input channels (auto rewrites up to 4)")
    big = s2d.Candidate(batch=32, channels=3, kernel=(7, 7), padded_kernel=(8, 8), **base)
    assert "batch 32" in s2d.should_rewrite(big)[1]
    small = s2d.Candidate(batch=1, channels=3, kernel=(2, 2), padded_kernel=(2, 2), **base)
    assert "kernel 2x2" in s2d.should_rewrite(small)[1]


@pytest.mark.parametrize("size,padding", [(64, "VALID"), (70, "VALID"), (64, "SAME")])
def test_auto_rewrites_a_patch_embedding(size, padding):
    """A ViT's patch embedding (kernel = stride) is one matrix product
    after the rewrite; auto takes it, also where trailing pixels the
    convolution never reads are cut (70 = 4 x 16 + 6, VALID)."""
    model = convert_tf(stem(size=size, kernel=16, stride=16, padding=padding, filters=32))
    result = fusekit.optimize(model, passes=["space_to_depth"])
    assert conv_geometry(result.model) == [("CONV_2D", [1, 4, 4, 768], [32, 1, 1, 768], 1)]
    assert result.report.line("space_to_depth").notes == []
    assert_same(model, result.model)


def test_auto_cost_model_takes_patches_only():
    from fusekit.passes import space_to_depth as s2d

    def geometry(kernel: int, stride: int, padded: int, pads) -> s2d.Candidate:
        return s2d.Candidate(
            op=None,
            depthwise=False,
            batch=1,
            channels=3,
            kernel=(kernel, kernel),
            stride=stride,
            block=stride,
            pads=pads,
            padded_kernel=(padded, padded),
        )

    assert s2d.should_rewrite(geometry(16, 16, 16, ((0, 0), (0, 0)))) == (True, "")
    assert s2d.should_rewrite(geometry(14, 14, 14, ((0, -6), (0, -6)))) == (True, "")
    assert not s2d.should_rewrite(geometry(7, 4, 8, ((0, 1), (0, 1))))[0]  # overlapping
    assert not s2d.should_rewrite(geometry(4, 4, 4, ((1, 1), (1, 1))))[0]  # padded


@pytest.mark.parametrize("size,padding", [(32, "SAME"), (33, "SAME"), (32, "VALID"), (33, "VALID")])
def test_dynamic_batch(size, padding):
    """Batch None: PAD, SLICE (size -1 on the batch) and SPACE_TO_DEPTH
    follow the batch the model is resized to."""
    from ai_edge_litert.interpreter import Interpreter

    model = convert_tf(stem(size=size, batch=None, kernel=4, padding=padding, filters=8))
    result = fusekit.optimize(model, passes=["space_to_depth"], space_to_depth="on")
    assert count(result.model, "SPACE_TO_DEPTH") == 1
    x = np.random.default_rng(0).standard_normal((3, size, size, 3)).astype(np.float32)
    outs = []
    for m in (model, result.model):
        interp = Interpreter(model_content=m)
        detail = interp.get_input_details()[0]
        interp.resize_tensor_input(detail["index"], x.shape)
        interp.allocate_tensors()
        interp.set_tensor(detail["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    assert outs[0].shape[0] == 3
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5, rtol=0)
