"""Attention operands read in place from a packed tensor
(fusion/packed_operands.py): the part of its source each operand is,
proven on indices, and the zoo's packed-qkv models fused that way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_cases import fused_ops

import fusekit
from fusekit.model import model_ops
from fusekit.passes.fusion import axis_map, packed_operands
from fusekit.passes.fusion.axis_map import Atom, View

ZOO = Path(__file__).resolve().parent.parent / "data" / "torch" / "zoo"


def _view(shape: list[int], axes: list[list[tuple[int, int, int]]], offset: list[int]) -> View:
    # Atoms (source axis, stride in indices of that axis, size).
    atoms = [axis_map.normalized([Atom(*a) for a in axis]) for axis in axes]
    return View(0, shape, atoms, offset)


def _elements(found: packed_operands.Packed, total: int) -> np.ndarray:
    """The source's flat indices the kernel reads for the part, as the op's
    operand (a rank-5 input loses the sliced axis)."""
    axis, begin, size = found.part
    seen = np.arange(total).reshape(found.shape)
    part = np.take(seen, range(begin, begin + size), axis=axis)
    return part.squeeze(axis) if len(found.shape) == 5 else part


def test_grouped_query_projection_parts():
    # [B, S, (8 + 2 + 2) * 16]: q heads 0-7, k heads 8-9, v heads 10-11.
    shape = [2, 10, 12 * 16]
    b, s = (0, 1, 2), (1, 1, 10)
    source = np.arange(2 * 10 * 192).reshape(2, 10, 12, 16)
    for first, count in ((0, 8), (8, 2), (10, 2)):
        view = _view(shape, [[b], [s], [(2, 16, count)], [(2, 1, 16)]], [0, 0, first * 16])
        found = packed_operands.packed(view)
        assert found is not None, (first, count)
        want = source[:, :, first : first + count]
        np.testing.assert_array_equal(_elements(found, source.size), want)


def test_timm_packing():
    # [B, S, 3 * 4 * 8] (timm's [B, S, 3, H, D]): k is part 1 of the 3.
    shape = [1, 5, 96]
    k = _view(shape, [[(0, 1, 1)], [(1, 1, 5)], [(2, 8, 4)], [(2, 1, 8)]], [0, 0, 32])
    found = packed_operands.packed(k)
    want = np.arange(480).reshape(1, 5, 3, 4, 8)[:, :, 1]
    np.testing.assert_array_equal(_elements(found, 480), want)


@pytest.mark.parametrize(
    "axes, offset",
    [
        # Heads and depth swapped: a transpose, not a part.
        ([[(0, 1, 1)], [(1, 1, 5)], [(2, 1, 8)], [(2, 8, 4)]], [0, 0, 0]),
        # Every other head: strided, not contiguous.
        ([[(0, 1, 1)], [(1, 1, 5)], [(2, 16, 4)], [(2, 1, 8)]], [0, 0, 0]),
    ],
)
def test_not_one_part_is_left_to_a_copy(axes, offset):
    assert packed_operands.packed(_view([1, 5, 96], axes, offset)) is None


def test_the_source_itself_is_no_part():
    view = _view([1, 5, 4, 8], [[(0, 1, 1)], [(1, 1, 5)], [(2, 1, 4)], [(3, 1, 8)]], [0] * 4)
    assert packed_operands.packed(view) is None


@pytest.mark.parametrize(
    "name", ["timm_vit", "timm_deit", "timm_swin", "timm_caformer", "timm_maxvit", "timm_levit"]
)
def test_zoo_packed_qkv_is_read_in_place(name):
    plain = (ZOO / f"{name}.tflite").read_bytes()
    fused = fusekit.optimize(plain).model
    ops = fused_ops(fused, "fusekit_attention")
    assert ops and all("k_slice" in op.attrs for op in ops), name
    before, after = model_ops.op_counts(plain), model_ops.op_counts(fused)
    assert after.get("SLICE", 0) < before.get("SLICE", 0), (name, before, after)
    # The fused model computes what the plain one does.
    with np.load(ZOO / f"{name}.npz") as data:
        feeds = {k: data[k] for k in data.files if k.startswith("serving_default/in/")}
    outs = []
    for model in (plain, fused):
        runner = fusekit.Interpreter(model_content=model, runtime="litert", num_threads=1)
        runner = runner.get_signature_runner("serving_default")
        got = runner(**{k.split("/")[-1]: v for k, v in feeds.items()})
        outs.append(got)
    for key in outs[0]:
        np.testing.assert_allclose(outs[1][key], outs[0][key], atol=1e-5, err_msg=name)
