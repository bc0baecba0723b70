"""fusekit.CompiledModel: LiteRT's CompiledModel API (libLiteRt.so's C API,
custom ops through LiteRtAddCustomOpKernelOption) with fusekit's kernels."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import built_models
from model_surgery import custom_ops, edit

import fusekit
from fusekit.errors import FusekitError, MissingKernelError
from fusekit.model import tflite_schema
from fusekit.run import aligned_model


def interpreter_outputs(model: bytes, runs: list[list[np.ndarray]], threads: int, **kw):
    it = fusekit.Interpreter(model_content=model, num_threads=threads, runtime="litert", **kw)
    details = it.get_input_details()
    outs = []
    for feeds in runs:
        for d, x in zip(details, feeds, strict=True):
            it.resize_tensor_input(d["index"], x.shape)
        it.allocate_tensors()
        for d, x in zip(details, feeds, strict=True):
            it.set_tensor(d["index"], x)
        it.invoke()
        outs.append([it.get_tensor(d["index"]) for d in it.get_output_details()])
    return outs


def compiled_outputs(model: bytes, runs: list[list[np.ndarray]], threads: int, **kw):
    """Runs feeds given in the subgraph's input order; returns the outputs in
    the subgraph's output order (signatures name them in an order of their
    own)."""
    root = tflite_schema.model(model)
    sig = root.item("signature_defs", 0)
    tensor_of = {
        side: {t.string("name").decode(): t.scalar("tensor_index") for t in sig.items(side)}
        for side in ("inputs", "outputs")
    }
    sg = root.item("subgraphs", 0)
    sg_in, sg_out = list(sg.values("inputs")), list(sg.values("outputs"))
    outs = []
    with fusekit.CompiledModel.from_buffer(model, num_threads=threads, **kw) as cm:
        names = cm.get_signature_by_index(0)
        for feeds in runs:
            by_tensor = dict(zip(sg_in, feeds, strict=True))
            ordered = [by_tensor[tensor_of["inputs"][n]] for n in names["inputs"]]
            for i, x in enumerate(ordered):
                cm.resize_input_tensor(i, x.shape)
            got = dict(
                zip(
                    (tensor_of["outputs"][n] for n in names["outputs"]),
                    cm.run(ordered),
                    strict=True,
                )
            )
            outs.append([got[t] for t in sg_out])
    return outs


def assert_same(got_runs, want_runs):
    for got, want in zip(got_runs, want_runs, strict=True):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "op",
    [
        "fusekit_layer_norm",
        "fusekit_rms_norm",
        "fusekit_group_norm",
        "fusekit_rotary_embedding",
        "fusekit_attention",
    ],
)
def test_library_ops_equal_interpreter(op, threads):
    models = built_models()[op]
    assert models
    for case in models:
        want = interpreter_outputs(case.model, case.runs, threads)
        got = compiled_outputs(case.model, case.runs, threads)
        assert_same(got, want)


@pytest.fixture(scope="module")
def layer_norm_f16(tmp_path_factory):
    import tensorflow as tf

    depth = 96
    rng = np.random.default_rng(5)
    gamma = (rng.random(depth) + 0.5).astype(np.float16)
    beta = rng.standard_normal(depth).astype(np.float16)

    class Half(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gamma = tf.Variable(gamma)
            self.beta = tf.Variable(beta)

        @tf.function(input_signature=[tf.TensorSpec([None, depth], tf.float16)])
        def __call__(self, x):
            return fusekit.ops.layer_norm(x, self.gamma, self.beta)

    path = tmp_path_factory.mktemp("f16") / "m"
    tf.saved_model.save(Half(), str(path))
    return fusekit.convert(str(path)).model


@pytest.mark.parametrize("threads", [1, 2])
def test_float16_model_equals_interpreter(layer_norm_f16, threads):
    x = np.random.default_rng(1).standard_normal((300, 96)).astype(np.float16)
    want = interpreter_outputs(layer_norm_f16, [[x]], threads)
    got = compiled_outputs(layer_norm_f16, [[x]], threads)
    assert got[0][0].dtype == np.float16
    np.testing.assert_array_equal(got[0][0], want[0][0])


@pytest.fixture(scope="module")
def attention_f16(tmp_path_factory):
    import tensorflow as tf

    spec = tf.TensorSpec([None, 6, 2, 8], tf.float16)

    class Half(tf.Module):
        @tf.function(input_signature=[spec, spec, spec])
        def __call__(self, q, k, v):
            return fusekit.ops.attention(q, k, v, causal=True)

    path = tmp_path_factory.mktemp("attn_f16") / "m"
    tf.saved_model.save(Half(), str(path))
    return fusekit.convert(str(path)).model


@pytest.mark.parametrize("threads", [1, 2])
def test_float16_attention_equals_interpreter(attention_f16, threads):
    rng = np.random.default_rng(2)
    feeds = [rng.standard_normal((3, 6, 2, 8)).astype(np.float16) for _ in range(3)]
    want = interpreter_outputs(attention_f16, [feeds], threads)
    got = compiled_outputs(attention_f16, [feeds], threads)
    assert got[0][0].dtype == np.float16
    assert_same(got, want)


def test_kernels_get_the_thread_count():
    """num_threads reaches both XNNPACK (CPU options) and fusekit's pool."""
    import os

    model = built_models()["fusekit_layer_norm"][0].model  # depth 1, 2x9000 rows
    x = np.ones((2, 9000, 1), np.float32)
    counts = {}
    for threads in (1, 3):
        before = len(os.listdir("/proc/self/task"))
        with fusekit.CompiledModel.from_buffer(model, num_threads=threads) as cm:
            cm.resize_input_tensor(0, x.shape)
            cm.run([x])
            counts[threads] = len(os.listdir("/proc/self/task")) - before
    assert counts[3] >= counts[1] + 2, counts


def layer_norm_model() -> bytes:
    return built_models()["fusekit_layer_norm"][1].model  # depth 17


def test_signatures_and_buffers_follow_litert_api():
    model = layer_norm_model()
    with fusekit.CompiledModel.from_buffer(model) as cm:
        assert cm.get_num_signatures() == 1
        key = cm.get_signature_by_index(0)["key"]
        assert cm.get_signature_index(key) == 0 and cm.get_signature_index("nope") == -1
        (name,) = cm.get_signature_list()[key]["inputs"]
        (out_name,) = cm.get_signature_list()[key]["outputs"]
        cm.resize_input_tensor(0, [2, 3, 17])
        x = np.random.default_rng(0).standard_normal((2, 3, 17)).astype(np.float32)
        inp = cm.create_input_buffer_by_name(key, name)
        out = cm.create_output_buffer_by_name(key, out_name)
        inp.write(x)
        cm.run_by_name(key, {name: inp}, {out_name: out})
        y = out.numpy()
        assert y.shape == (2, 3, 17)
        np.testing.assert_array_equal(out.read(5, np.float32), y.reshape(-1)[:5])
        np.testing.assert_array_equal(cm.run([x])[0], y)


def test_bad_inputs_are_named():
    model = layer_norm_model()
    with fusekit.CompiledModel.from_buffer(model) as cm:
        cm.resize_input_tensor(0, [1, 2, 17])
        (buf,) = cm.create_input_buffers(0)
        with pytest.raises(FusekitError, match=r"input 'x' is float32, got an array of int32"):
            buf.write(np.zeros((1, 2, 17), np.int32))
        with pytest.raises(FusekitError, match=r"input 'x' has shape \[1, 2, 17\]"):
            buf.write(np.zeros((1, 2, 16), np.float32))
        with pytest.raises(FusekitError, match="has 1 inputs, got 2 buffers"):
            cm.run_by_index(0, [buf, buf], cm.create_output_buffers(0))
        with pytest.raises(FusekitError, match="unknown signature 'nope'"):
            cm.run_by_name("nope", {}, {})


def test_malformed_options_fail_compilation_with_the_op_named():
    def garble(m):
        for op in custom_ops(m, "fusekit_layer_norm"):
            op.customOptions = np.frombuffer(b"\x07\x01\x02", np.uint8)

    bad = edit(layer_norm_model(), garble)
    match = "fusekit_layer_norm: malformed custom options"
    with pytest.raises(fusekit.KernelRunError, match=match):
        fusekit.CompiledModel.from_buffer(bad)


def test_wrong_attr_type_is_named():
    from flatbuffers import flexbuffers

    def retype(m):
        for op in custom_ops(m, "fusekit_layer_norm"):
            op.customOptions = np.frombuffer(flexbuffers.Dumps({"epsilon": "tiny"}), np.uint8)

    bad = edit(layer_norm_model(), retype)
    with pytest.raises(fusekit.KernelRunError, match="fusekit_layer_norm: .*epsilon"):
        fusekit.CompiledModel.from_buffer(bad)


def test_dtype_the_kernel_refuses_fails_the_run_visibly():
    """Shape inference sees layouts only, so a node whose dtypes no variant
    accepts passes compilation; LiteRT then ignores Run's status, and only
    the recorded error stops the outputs from being read as a result."""

    def to_int32(m):
        (op,) = custom_ops(m, "fusekit_layer_norm")
        m.subgraphs[0].tensors[op.inputs[0]].type = 2  # INT32

    bad = edit(layer_norm_model(), to_int32)
    with fusekit.CompiledModel.from_buffer(bad) as cm:
        cm.resize_input_tensor(0, [1, 1, 17])
        with pytest.raises(fusekit.KernelRunError, match="fusekit_layer_norm: input 'x' must be"):
            cm.run([np.ones((1, 1, 17), np.int32)])
        # The error is reported once per failure, and again on the next run.
        with pytest.raises(fusekit.KernelRunError):
            cm.run([np.ones((1, 1, 17), np.int32)])


def test_missing_kernel_is_refused_before_litert():
    def rename(m):
        for code in m.operatorCodes:
            if code.customCode == b"fusekit_layer_norm":
                code.customCode = b"nobody_provides_this"

    with pytest.raises(MissingKernelError, match="nobody_provides_this"):
        fusekit.CompiledModel.from_buffer(edit(layer_norm_model(), rename))


def test_weights_are_moved_to_aligned_blobs():
    model = layer_norm_model()
    aligned = aligned_model.align_weights(model)
    assert aligned_model.needs_alignment(model)
    assert not aligned_model.needs_alignment(aligned)
    assert aligned_model.align_weights(aligned) is aligned


def test_leak_over_1000_create_run_destroy_cycles():
    model = layer_norm_model()
    x = np.random.default_rng(0).standard_normal((1, 1, 17)).astype(np.float32)

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def cycle() -> None:
        with fusekit.CompiledModel.from_buffer(model, num_threads=2) as cm:
            cm.run([x])

    for _ in range(100):
        cycle()
    before = rss()
    for _ in range(1000):
        cycle()
    grown = rss() - before
    # A leaked compiled model (interpreter, XNNPACK, thread pool) costs far
    # more than 8 KiB per cycle; allocator noise stays well below this bound.
    assert grown < 8 * 1024 * 1000, f"RSS grew {grown / 1e6:.1f} MB over 1000 cycles"


# ------------------------------------------------------------- user plugin


@pytest.fixture(scope="module")
def user_plugin_model(tmp_path_factory):
    import os
    import sys
    from pathlib import Path

    import tensorflow as tf

    example = Path(__file__).resolve().parent.parent / "examples" / "custom_op"
    os.environ.setdefault("FUSEKIT_CACHE_DIR", str(tmp_path_factory.mktemp("plugin_cache")))
    plugin = fusekit.build_plugin("user_ops_compiled", [example / "my_custom_fused_op.cc"])
    sys.path.insert(0, str(example))
    from model import my_custom_fused_op

    class UserModel(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 5, 3], tf.float32)] * 2)
        def __call__(self, a, b):
            gated, clipped = my_custom_fused_op(a, b, example_option=1)
            return {"gated": gated, "clipped": clipped}

    path = tmp_path_factory.mktemp("user_model") / "m"
    tf.saved_model.save(UserModel(), str(path))
    return plugin, fusekit.convert(str(path), plugins=[plugin]).model


@pytest.mark.parametrize("threads", [1, 2])
def test_user_plugin_equals_interpreter(user_plugin_model, threads):
    plugin, model = user_plugin_model
    rng = np.random.default_rng(3)
    runs = [[rng.standard_normal((n, 5, 3)).astype(np.float32) for _ in range(2)] for n in (1, 4)]
    want = interpreter_outputs(model, runs, threads, plugins=[plugin])
    got = compiled_outputs(model, runs, threads, plugins=[plugin])
    assert_same(got, want)
    with pytest.raises(MissingKernelError, match="my_custom_fused_op"):
        fusekit.CompiledModel.from_buffer(model)
