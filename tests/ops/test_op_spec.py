"""One spec per op: what a kernel declares (operands, optional inputs, attrs
with defaults and ranges, options version) is what fusekit.ops, the Keras
layers and the passes write, and version-1 models still run."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import tensorflow as tf
from flatbuffers import flexbuffers
from model_surgery import custom_ops, edit
from runtimes import RUNTIMES, Job, run_jobs

import fusekit
from fusekit.errors import OpSpecError, PassError
from fusekit.passes import ModelView
from fusekit.passes.fusion.emit import replace_with_custom
from fusekit.run.op_spec import op_spec

LN, GN, ATT = "fusekit_layer_norm", "fusekit_group_norm", "fusekit_attention"


def _convert(tmp_path, name, fn, spec):
    class Module(tf.Module):
        @tf.function(input_signature=[spec])
        def __call__(self, x):
            return fn(x)

    module = Module()
    tf.saved_model.save(module, str(tmp_path / name))
    return module, fusekit.convert(str(tmp_path / name)).model


def _options(m, op_name) -> dict:
    (op,) = custom_ops(m, op_name)
    return flexbuffers.Loads(bytes(bytearray(op.customOptions)))


def _as_version_1(model: bytes, op_name: str) -> bytes:
    """The model as fusekit wrote it before options were versioned: the
    present optional inputs packed after x, bool attrs scale and center
    saying which they are (written only when one is missing)."""

    def change(m):
        (op,) = custom_ops(m, op_name)
        inputs = [int(t) for t in op.inputs] + [-1] * (3 - len(op.inputs))
        options = {k: v for k, v in _options(m, op_name).items() if k != "options_version"}
        if -1 in inputs[1:]:
            options |= {"scale": inputs[1] >= 0, "center": inputs[2] >= 0}
        op.inputs = np.array([t for t in inputs if t >= 0], np.int32)
        op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(options)), np.uint8)

    return edit(model, change)


GAMMA = np.linspace(0.5, 1.5, 8, dtype=np.float32)
BETA = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
# (op, has gamma, has beta): absent ones are left off the end (a missing
# gamma before beta is written as ones: LiteRT's CompiledModel crashes on a
# custom op that lists input -1).
FORMS = [
    (LN, False, True),
    (LN, True, False),
    (LN, False, False),
    (GN, False, True),
    (GN, True, True),
]


@pytest.fixture(scope="module")
def norm_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spec_norms")
    out = []
    for i, (op, scale, center) in enumerate(FORMS):
        gamma = tf.constant(GAMMA) if scale else None
        beta = tf.constant(BETA) if center else None
        if op == LN:
            fn = lambda x, g=gamma, b=beta: fusekit.ops.layer_norm(x, g, b, epsilon=1e-3)  # noqa: E731
        else:
            fn = lambda x, g=gamma, b=beta: fusekit.ops.group_norm(x, g, b, groups=2)  # noqa: E731
        module, model = _convert(tmp, f"m{i}", fn, tf.TensorSpec([2, 3, 8]))
        out.append((op, scale, center, module, model))
    return out


def test_absent_inputs_are_absent_and_options_carry_the_version(norm_models):
    """Version 2: no scale/center flags; a missing gamma or beta is tensor
    index -1 (or left off the end); the options say version 2."""
    for op, scale, center, _, model in norm_models:
        m = ModelView(model).m
        (node,) = custom_ops(m, op)
        inputs = [int(t) for t in node.inputs]
        want = [scale or center, center]
        while want and not want[-1]:
            want.pop()
        assert [t >= 0 for t in inputs[1:]] == want, (op, scale, center, inputs)
        options = _options(m, op)
        assert options["options_version"] == 2
        assert "scale" not in options and "center" not in options


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_version_1_models_still_run(runtime, norm_models):
    """A model in the old layout (packed inputs, scale/center flags) gives
    the same outputs as the version-2 model and as TensorFlow."""
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    jobs, references = [], []
    for op, _, _, module, model in norm_models:
        old = _as_version_1(model, op)
        assert old != model
        jobs += [Job(model, [[x]]), Job(old, [[x]])]
        references.append(module(x).numpy())
    outcomes = run_jobs(runtime, jobs)
    for k, reference in enumerate(references):
        (new,) = outcomes[2 * k].ok()[0]
        (old,) = outcomes[2 * k + 1].ok()[0]
        np.testing.assert_array_equal(new, old)
        np.testing.assert_allclose(new, reference, atol=1e-5)


def test_compiled_model_runs_absent_inputs(norm_models):
    """LiteRT's CompiledModel (the custom-op kernel adapter) runs the norms
    without gamma or beta, in both versions."""
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    for op, _, _, module, model in norm_models:
        for version in (model, _as_version_1(model, op)):
            (y,) = fusekit.CompiledModel.from_buffer(version).run([x])
            np.testing.assert_allclose(y, module(x).numpy(), atol=1e-5)


def test_attention_without_scale_carries_no_scale(tmp_path):
    """scale=None is absent in the op (the kernel takes 1/sqrt(D)), not a
    value fusekit computed for it; an explicit scale is written."""
    q = tf.constant(np.random.default_rng(2).standard_normal((1, 4, 2, 16)).astype(np.float32))
    for scale, name in ((None, "none"), (0.25, "quarter")):
        module, model = _convert(
            tmp_path,
            name,
            lambda x, s=scale: fusekit.ops.attention(x, q, q, scale=s),
            tf.TensorSpec([1, 4, 2, 16]),
        )
        options = _options(ModelView(model).m, ATT)
        if scale is None:
            assert "scale" not in options
        else:
            assert options["scale"] == pytest.approx(scale)
        ((y,),) = run_jobs("litert", [Job(model, [[q.numpy()]])])[0].ok()
        np.testing.assert_allclose(y, module(q).numpy(), atol=1e-5)


def test_the_spec_is_the_kernels_declaration():
    """Defaults, ranges and rules come from the library, not from Python."""
    gn = op_spec(GN)
    assert gn.attr("groups").required and gn.attr("groups").min == 1
    assert gn.attr("epsilon").default == pytest.approx(1e-5) and gn.attr("epsilon").min == 0
    assert gn.input("x").rank_text() == "2 to 5"
    assert gn.input("beta").optional and gn.input("beta").vector_of.input == "x"
    att = op_spec(ATT)
    assert att.attr("scale").default is None and not att.attr("scale").required
    assert op_spec("fusekit_rms_norm").attr("epsilon").default == pytest.approx(1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: fusekit.ops.layer_norm(np.ones((2, 8), np.float32), None, None, -1.0), ">= 0"),
        (lambda: fusekit.ops.rms_norm(np.ones((2, 8), np.float32), GAMMA, float("inf")), "finite"),
        (lambda: op_spec(LN).check_attrs({"epsilom": 1e-5}), "no attr 'epsilom'"),
        (lambda: op_spec(GN).check_attrs({"epsilon": 1e-5}), "'groups' (int) is required"),
        (lambda: op_spec(GN).check_attrs({"groups": 2.5}), "must be an int"),
        (
            lambda: fusekit.ops.group_norm(np.ones((1, 1, 1, 1, 1, 8), np.float32), None, None, 2),
            "rank 2 to 5",
        ),
    ],
)
def test_the_spec_refuses_what_the_kernel_would(call, message):
    with pytest.raises(OpSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


@pytest.mark.parametrize("absent", [1, 2], ids=["gamma_before_beta", "trailing_beta"])
def test_compiled_model_refuses_an_absent_input_it_would_crash_on(norm_models, absent):
    """A custom op listing tensor index -1 (a valid model: the Interpreter
    runs it) crashes LiteRT's CompiledModel, before a present input or at the
    end alike: refused with the op, node and input named instead (the check
    C apps call, fusekit_litert_check_model)."""
    op, scale, center, module, model = norm_models[0]
    assert (op, scale, center) == (LN, False, True)

    def drop(m):
        (node,) = custom_ops(m, LN)
        inputs = [int(t) for t in node.inputs]
        inputs[absent] = -1
        node.inputs = np.array(inputs, np.int32)

    dropped = edit(model, drop)
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    ((y,),) = run_jobs("litert", [Job(dropped, [[x]])])[0].ok()
    # Left out, gamma was ones anyway; left out, beta is zero.
    want = module(x).numpy() - (BETA if absent == 2 else 0)
    np.testing.assert_allclose(y, want, atol=1e-5)
    name = ["x", "gamma", "beta"][absent]
    message = f"{LN}: subgraph 0 operator 0 input {absent} ('{name}') is tensor index -1"
    with pytest.raises(fusekit.errors.RuntimeUnsafeModelError, match=re.escape(message)) as info:
        fusekit.CompiledModel.from_buffer(dropped)
    # The model is valid (the Interpreter above ran it): the message says
    # which runtime cannot, not that the model is malformed.
    assert "not a valid TFLite model" not in str(info.value)
    assert "LiteRT's CompiledModel cannot run" in str(info.value)
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


def test_an_emitted_op_the_kernel_refuses_is_a_pass_error(norm_models):
    """The emitter asks the spec before writing: an int32 x matches no
    variant of the layer norm kernel."""
    _, _, _, _, model = norm_models[0]
    view = ModelView(model)
    (graph,) = view.graphs()
    x = graph.add_tensor([2, 8], 2, "x_int32")  # INT32
    out = graph.add_tensor([2, 8], 2, "y_int32")
    with pytest.raises(PassError, match="match no variant"):
        replace_with_custom(graph, LN, [x], out, {"epsilon": 1e-5}, [])
    with pytest.raises(OpSpecError, match="no attr 'scale'"):
        x32 = graph.add_tensor([2, 8], 0, "x")
        replace_with_custom(graph, LN, [x32], graph.add_tensor([2, 8], 0, "y"), {"scale": True}, [])
