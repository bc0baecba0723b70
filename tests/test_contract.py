"""The contract every model fusekit writes keeps: it opens and runs on the
three Interpreters (ai-edge-litert, tf.lite, tflite-runtime) and on
fusekit.CompiledModel with the outputs of the plain model (within 1e-5),
every signature in every order, twice; a resize runs right or is refused.

The fast tier walks the models whose failures this contract was written
for: a BART encoder-decoder (nodes of one op at different shapes), a
prefill + decode generative model (two signatures), a Keras
LayerNormalization with beta but no gamma, a dynamic-batch Keras model.
The slow tier walks every committed litert-torch fixture, and quantized
forms (TF converter full int8, ai-edge-quantizer static int8 / int16,
dynamic int8, blockwise int4) of a generative, a Keras and a Llama fixture.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from runtimes import Job, run_jobs

import fusekit
from fusekit import ResizeRefusedError

DATA = Path(__file__).resolve().parent / "data"
TORCH = json.loads((DATA / "torch" / "manifest.json").read_text())["fixtures"]
ZOO = json.loads((DATA / "torch" / "zoo" / "manifest.json").read_text())["models"]
# The zoo's exports whose nodes of one op differ in shape or serve several
# signatures (prefill + decode, encoder + decoder): the cases node identity
# and call order matter for (litert-torch's Hugging Face and generative
# exporters among them).
ZOO_CASES = (
    "export_hf_default",
    "export_hf_default_int8",
    "export_hf_gpu",
    "gen_builder",
    "gen_builder_transposed",
    "hf_t5",
    "hf_whisper",
    # q, k and v read in place from one packed tensor (fusekit_attention's
    # q_slice / k_slice / v_slice): timm's packed qkv, global and windowed.
    "timm_vit",
    "timm_swin",
)
TOLERANCE = 1e-5


def _feeds(npz: Path, signature: str | None) -> dict[str, np.ndarray]:
    with np.load(npz) as data:
        if signature is None:  # the encoder-decoder fixture: args_*
            return {k: data[k] for k in data.files if k.startswith("args_")}
        prefix = f"{signature}/in/"
        return {k[len(prefix) :]: data[k] for k in data.files if k.startswith(prefix)}


def _torch_case(name: str) -> tuple[bytes, dict[str, dict[str, np.ndarray]]]:
    (entry,) = [f for f in TORCH if f["name"] == name]
    plain = (DATA / "torch" / entry["model"]).read_bytes()
    feeds = {
        s["name"]: _feeds(DATA / "torch" / entry["data"], s["name"]) for s in entry["signatures"]
    }
    return plain, feeds


def _zoo_case(name: str) -> tuple[bytes, dict[str, dict[str, np.ndarray]]]:
    (entry,) = [m for m in ZOO if m["name"] == name]
    plain = (DATA / "torch" / "zoo" / entry["model"]).read_bytes()
    npz = DATA / "torch" / "zoo" / entry["data"]
    return plain, {s["name"]: _feeds(npz, s["name"]) for s in entry["signatures"]}


def _bart() -> tuple[bytes, dict[str, dict[str, np.ndarray]]]:
    plain = (DATA / "encdec" / "hf_bart.tflite").read_bytes()
    return plain, {"serving_default": _feeds(DATA / "encdec" / "hf_bart.npz", None)}


def _keras(
    layer, shape, int8_weights: bool = False
) -> tuple[bytes, dict[str, dict[str, np.ndarray]]]:
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    inp = keras.Input(shape)
    h = keras.layers.Dense(16)(inp)
    h = layer(h)
    model = keras.Model(inp, keras.layers.Dense(4)(h))
    # Off Keras' initial gamma 1 / beta 0, which would hide a swapped operand.
    model.set_weights(
        [rng.uniform(-0.5, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()]
    )
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8_weights:  # the converter's dynamic-range quantization
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    plain = converter.convert()
    x = rng.standard_normal((1, *shape)).astype(np.float32)
    runner = fusekit.Interpreter(model_content=plain).get_signature_runner()
    (name,) = runner.get_input_details()
    return plain, {"serving_default": {name: x}}


def _keras_beta_only():
    import keras

    return _keras(keras.layers.LayerNormalization(scale=False, center=True), (8, 16))


def _keras_3d():
    import keras

    return _keras(keras.layers.LayerNormalization(), (8, 16))


def _keras_3d_int8_weights():
    import keras

    return _keras(keras.layers.LayerNormalization(), (8, 16), int8_weights=True)


def _keras_dynamic_batch():
    import keras

    return _keras(keras.layers.LayerNormalization(), (16,))


CASES = {
    "hf_bart": _bart,
    "gen_decoder": lambda: _torch_case("gen_decoder"),
    "keras_beta_only": _keras_beta_only,
    "keras_dynamic_batch": _keras_dynamic_batch,
    "keras_3d": _keras_3d,
    "keras_3d_int8_weights": _keras_3d_int8_weights,
}
CASES.update(
    {f["name"]: (lambda n=f["name"]: _torch_case(n)) for f in TORCH if f["name"] not in CASES}
)
CASES.update({f"zoo_{n}": (lambda n=n: _zoo_case(n)) for n in ZOO_CASES})
FAST = ("hf_bart", "gen_decoder", "keras_beta_only", "keras_dynamic_batch", "keras_3d")

_CACHE: dict[str, tuple[bytes, bytes, dict]] = {}


def case(name: str) -> tuple[bytes, bytes, dict[str, dict[str, np.ndarray]]]:
    """(plain model, fused model, feeds by signature)."""
    if name not in _CACHE:
        plain, feeds = CASES[name]()
        _CACHE[name] = (plain, fusekit.optimize(plain).model, feeds)
    return _CACHE[name]


def reference(plain: bytes, feeds) -> dict[str, dict[str, np.ndarray]]:
    """The plain model's outputs on ai-edge-litert, by signature."""
    it = fusekit.Interpreter(model_content=plain, runtime="litert")
    return {key: it.get_signature_runner(key)(**inputs) for key, inputs in feeds.items()}


def assert_close(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        diff = float(np.max(np.abs(np.asarray(got[name], np.float64) - want[name])))
        assert diff <= TOLERANCE, f"{what}: output {name!r} differs by {diff:g}"


def compiled_run(cm: fusekit.CompiledModel, key: str, inputs) -> dict[str, np.ndarray]:
    index = cm.get_signature_index(key)
    names = cm.get_signature_by_index(index)["outputs"]
    return dict(zip(names, cm.run(inputs, index), strict=True))


def _cases(fast: bool) -> list:
    return [pytest.param(n, id=n) for n in CASES if (n in FAST) == fast]


def check_compiled_model(name: str) -> None:
    plain, fused, feeds = case(name)
    want = reference(plain, feeds)
    with fusekit.CompiledModel.from_buffer(fused) as cm:
        for order in itertools.permutations(feeds):
            for key in [k for k in order for _ in range(2)]:  # each twice in a row
                assert_close(
                    compiled_run(cm, key, feeds[key]),
                    want[key],
                    f"{name} {key} on CompiledModel, order {order}",
                )


def check_interpreters(name: str, runtime: str) -> None:
    plain, fused, feeds = case(name)
    want = reference(plain, feeds)
    jobs = [Job(fused, [inputs, inputs], signature=key) for key, inputs in feeds.items()]
    for (key, _), outcome in zip(feeds.items(), run_jobs(runtime, jobs), strict=True):
        if outcome.error is not None and outcome.error.startswith("RuntimeTooOldError"):
            # Refused before the runtime reads it, naming the op version
            # (tflite-runtime 2.14 and BERT's GATHER_ND v5): not a wrong run.
            assert runtime == "tflite_runtime", outcome.error
            continue
        for run in outcome.ok():
            assert_close(run, want[key], f"{name} {key} on {runtime}")


@pytest.mark.parametrize("name", _cases(True))
def test_compiled_model_every_signature_every_order(name):
    check_compiled_model(name)


@pytest.mark.parametrize("name", _cases(False))
def test_compiled_model_every_fixture(name):
    check_compiled_model(name)


@pytest.mark.parametrize("runtime", ["litert", "tf", "tflite_runtime"])
@pytest.mark.parametrize("name", _cases(True))
def test_interpreters_every_signature(name, runtime):
    check_interpreters(name, runtime)


@pytest.mark.parametrize("runtime", ["litert", "tf", "tflite_runtime"])
@pytest.mark.parametrize("name", _cases(False))
def test_interpreters_every_fixture(name, runtime):
    check_interpreters(name, runtime)


def test_bart_nodes_of_one_op_at_two_shapes_stay_apart():
    """Encoder and decoder layer norms are one op at two sequence lengths:
    through CompiledModel they gave outputs off by 0.48 when LiteRT's
    kernel calls were matched to nodes by creation order."""
    plain, fused, feeds = case("hf_bart")
    ops = [op.custom_code for op in fusekit.model.model_ops.list_ops(fused) if op.custom_code]
    assert ops.count("fusekit_layer_norm") > 10, ops
    want = reference(fused, feeds)["serving_default"]
    with fusekit.CompiledModel.from_buffer(fused) as cm:
        got = compiled_run(cm, "serving_default", feeds["serving_default"])
    assert_close(got, want, "hf_bart")


def test_a_beta_without_gamma_runs_on_compiled_model():
    """Keras LayerNormalization(scale=False, center=True): the fused op
    carries gamma as ones (the kernel's declared absent value), never -1,
    which LiteRT's CompiledModel cannot run."""
    plain, fused, feeds = case("keras_beta_only")
    view = fusekit.passes.ModelView(fused)
    (op,) = [
        op
        for graph in view.graphs()
        for op in graph.ops
        if view.op_name(op) == "CUSTOM:fusekit_layer_norm"
    ]
    assert -1 not in [int(t) for t in op.inputs] and len(op.inputs) == 3
    check_compiled_model("keras_beta_only")


def test_resize_runs_right_or_is_refused():
    """A dynamic-batch model resized through CompiledModel equals the
    Interpreter at the new batch; one whose shapes are computed while it
    runs (a Keras Dense on 3-D inputs: SHAPE -> RESHAPE) is refused, and
    the model keeps running at its old shape."""
    plain, fused, _ = case("keras_dynamic_batch")
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    runner = fusekit.Interpreter(model_content=plain).get_signature_runner()
    (name,) = runner.get_input_details()
    want = runner(**{name: x})
    with fusekit.CompiledModel.from_buffer(fused) as cm:
        for batch in (3, 1, 3):
            cm.resize_input_tensor(0, [batch, 16])
            got = compiled_run(cm, "serving_default", [x[:batch]])
            assert_close(got, {k: v[:batch] for k, v in want.items()}, f"batch {batch}")
    _, fused3, feeds = case("keras_3d")
    with fusekit.CompiledModel.from_buffer(fused3) as cm:
        with pytest.raises(ResizeRefusedError, match="gets its shape only while the model runs"):
            cm.resize_input_tensor(0, [3, 8, 16])
        (inputs,) = feeds.values()
        assert compiled_run(cm, "serving_default", inputs)


def test_kernels_registered_by_op_name_refuse_a_second_node():
    """fusekit_litert_add_kernels registers one kernel per op name without
    reading the model: LiteRT then shares it among every node of the op and
    never says which node a call is for.  A second node of an op is refused
    when LiteRT creates it (named in fusekit_litert_last_error), never run
    on a guess."""
    import ctypes

    from fusekit.run import aligned_model, litert_c, plugin
    from fusekit.run.litert_buffers import environment

    _, fused, _ = case("hf_bart")
    data = np.frombuffer(aligned_model.align_weights(fused), np.uint8)
    raw = np.empty(data.size + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    aligned = raw[start : start + data.size]
    aligned[:] = data
    lib = litert_c.lib()
    ours = plugin.open_plugin(fusekit.library_path())
    litert_c.bind_plugin(ours)
    ours.fusekit_litert_add_kernels.restype = ctypes.c_void_p
    ours.fusekit_litert_add_kernels.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    model, options, compiled = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    litert_c.check(
        lib.LiteRtCreateModelFromBuffer(
            environment(), aligned.ctypes.data, aligned.size, ctypes.byref(model)
        ),
        "model",
    )
    litert_c.check(lib.LiteRtCreateOptions(ctypes.byref(options)), "options")
    litert_c.check(
        lib.LiteRtSetOptionsHardwareAccelerators(options, litert_c.HW_ACCELERATOR_CPU), "cpu"
    )
    handle = ours.fusekit_litert_add_kernels(options, None, 1)
    assert handle
    lib.LiteRtCreateCompiledModel(environment(), model, options, ctypes.byref(compiled))
    try:
        error = (ours.fusekit_litert_last_error(handle) or b"").decode()
        assert "fusekit_layer_norm: refused to" in error, error
        assert "several nodes on one kernel entry" in error, error
        assert "fusekit_litert_add_model_kernels" in error, error
    finally:
        if compiled.value:
            lib.LiteRtDestroyCompiledModel(compiled)
        lib.LiteRtDestroyModel(model)
        lib.LiteRtDestroyOptions(options)
        ours.fusekit_litert_release(handle)


# ------------------------------------------------------------ quantized forms
#
# The same contract over quantized forms of the fixtures: the fused model
# equals the plain quantized model on the same runtime (quantized outputs
# differ from the float ones by design).  A runtime may refuse a form with a
# clear fusekit error only where it refuses the plain quantized model too.

QUANT_DIR = Path(__file__).resolve().parents[1] / "build" / "contract_quant"
AEQ_RECIPES = ("static_wi8_ai8", "static_wi8_ai16", "dynamic_wi8_afp32", "dynamic_wi4b32_afp32")
AEQ_BASES = ("gen_decoder", "keras_3d", "hf_llama")
STATIC_RECIPES = ("static_wi8_ai8", "static_wi8_ai16", "converter_int8")
# keras_3d's 16-wide weights have no 32-element blocks: the quantizer refuses
# dynamic_wi4b32_afp32 there.
QUANT_FORMS = [
    f"{b}:{r}"
    for b in AEQ_BASES
    for r in AEQ_RECIPES
    if (b, r) != ("keras_3d", "dynamic_wi4b32_afp32")
] + ["keras_3d:converter_int8"]


def _aeq(plain: bytes, feeds: dict, recipe_name: str) -> bytes:
    from ai_edge_quantizer import quantizer, recipe

    q = quantizer.Quantizer(plain)
    q.load_quantization_recipe(getattr(recipe, recipe_name)())
    calibration = None
    if recipe_name.startswith("static"):
        calibration = q.calibrate({key: [inputs] for key, inputs in feeds.items()})
    return bytes(q.quantize(calibration).quantized_model)


def _converter_int8() -> bytes:
    """keras_3d through the TF converter's full-integer quantization."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    inp = keras.Input((8, 16))
    h = keras.layers.LayerNormalization()(keras.layers.Dense(16)(inp))
    model = keras.Model(inp, keras.layers.Dense(4)(h))
    model.set_weights(
        [rng.uniform(-0.5, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()]
    )
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        [rng.standard_normal((1, 8, 16)).astype(np.float32)] for _ in range(8)
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter.convert()


def _quantized_feeds(model: bytes, feeds: dict) -> dict[str, dict[str, np.ndarray]]:
    """The float feeds quantized to the inputs a quantized model takes
    (static recipes quantize float inputs, a KV cache among them)."""
    it = fusekit.Interpreter(model_content=model)
    out = {}
    for key, inputs in feeds.items():
        details = it.get_signature_runner(key).get_input_details()
        out[key] = {}
        for name, x in inputs.items():
            dtype = np.dtype(details[name]["dtype"])
            if x.dtype.kind == "f" and dtype.kind == "i":
                scale, zero = details[name]["quantization"]
                info = np.iinfo(dtype)
                x = np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)
            out[key][name] = x
    return out


def quantized_case(form: str) -> tuple[bytes, bytes, dict[str, dict[str, np.ndarray]]]:
    """(plain quantized model, its fused form, feeds), the quantized model
    cached under build/ by the plain model's digest and the recipe."""
    import hashlib

    base, recipe_name = form.split(":")
    if form not in _CACHE:
        plain, _, feeds = case(base)
        digest = hashlib.sha256(plain).hexdigest()[:16]
        path = QUANT_DIR / f"{base}-{recipe_name}-{digest}.tflite"
        if not path.exists():
            QUANT_DIR.mkdir(parents=True, exist_ok=True)
            model = (
                _converter_int8()
                if recipe_name == "converter_int8"
                else _aeq(plain, feeds, recipe_name)
            )
            path.write_bytes(model)
        model = path.read_bytes()
        if recipe_name == "converter_int8":
            runner = fusekit.Interpreter(model_content=model).get_signature_runner()
            (name,) = runner.get_input_details()
            (x,) = next(iter(feeds.values())).values()
            feeds = {"serving_default": {name: x}}
        feeds = _quantized_feeds(model, feeds)
        _CACHE[form] = (model, fusekit.optimize(model).model, feeds)
    return _CACHE[form]


def _refusal(error: str | None) -> bool:
    """A refusal by a clear fusekit error (its class name leads the text)."""
    if error is None:
        return False
    cls = getattr(fusekit.errors, error.split(":")[0], None)
    return isinstance(cls, type) and issubclass(cls, fusekit.FusekitError)


def _compiled_runs(model: bytes, feeds) -> dict | fusekit.FusekitError:
    """Outputs by (order, step, key) on fusekit.CompiledModel, every
    signature in every order twice, or the fusekit error refusing the model."""
    try:
        with fusekit.CompiledModel.from_buffer(model) as cm:
            return {
                (order, i, key): compiled_run(cm, key, feeds[key])
                for order in itertools.permutations(feeds)
                for i, key in enumerate(k for k in order for _ in range(2))
            }
    except fusekit.FusekitError as e:
        return e


def _interpreter_runs(runtime: str, models: list[bytes], feeds) -> list[list]:
    """Per model, per signature: the Outcome of two runs on ``runtime``."""
    jobs = [
        Job(m, [inputs, inputs], signature=key) for m in models for key, inputs in feeds.items()
    ]
    outcomes = run_jobs(runtime, jobs)
    return [outcomes[i : i + len(feeds)] for i in range(0, len(outcomes), len(feeds))]


def _spread(got: dict, want: dict) -> float:
    """The largest difference between two runs' outputs."""
    return max(
        float(np.max(np.abs(np.asarray(got[n], np.float64) - np.asarray(want[n], np.float64))))
        for n in want
    )


def check_quantized(form: str) -> None:
    """Float activations: the fused model equals the plain quantized one on
    each runtime.  Integer activations: fuse_quantized computes the fused
    regions in float (docs/quantized.md), so the fused model is not bit-equal
    to the int8 ops it replaced; there it equals itself on every runtime
    (ai-edge-litert's Interpreter the reference) as closely as the plain
    model equals itself across runtimes: the integer ops fusekit leaves
    round differently on older runtimes (tflite-runtime 2.14 runs the plain
    hf_llama int8 model 3 steps off ai-edge-litert, with fusekit nowhere in
    the path); where the plain model does not run, within one quantization
    step.  A refusal is accepted only by a fusekit error, and only where the
    plain model is refused too."""
    plain, fused, feeds = quantized_case(form)
    integer = form.split(":")[1] in STATIC_RECIPES
    (litert_plain, litert_fused) = _interpreter_runs("litert", [plain, fused], feeds)
    for p in litert_plain:
        p.ok()  # the reference runtime runs every quantized form
    base = litert_fused if integer else litert_plain
    reference_runs = {key: o.ok()[0] for key, o in zip(feeds, base, strict=True)}
    for runtime in ("litert", "tf", "tflite_runtime"):
        runs_plain, runs_fused = (
            (litert_plain, litert_fused)
            if runtime == "litert"
            else _interpreter_runs(runtime, [plain, fused], feeds)
        )
        for key, p, f, ref in zip(feeds, runs_plain, runs_fused, litert_plain, strict=True):
            what = f"{form} {key} on {runtime}"
            if p.error is not None:
                # Unsupported there (tflite-runtime 2.14: no composites, no
                # int16 RSQRT, no int4 EMBEDDING_LOOKUP, per-channel hybrid
                # FULLY_CONNECTED / EMBEDDING_LOOKUP computed as zeros): the
                # fused model may fail too, but never run wrong.
                assert runtime == "tflite_runtime", f"{what}: the plain model fails: {p.error}"
                if f.error is not None:
                    continue
            elif f.error is not None:
                raise AssertionError(f"{what}: only the fused model fails: {f.error}")
            want = reference_runs[key] if integer or p.error is not None else p.ok()[0]
            tolerance = TOLERANCE
            if integer:
                steps = 1.0 if p.error is not None else _spread(p.ok()[0], ref.ok()[0])
                tolerance = max(TOLERANCE, steps)
            for run in f.ok():
                diff = _spread(run, want)
                assert diff <= tolerance, f"{what}: differs by {diff:g} (allowed {tolerance:g})"
    want_cm = _compiled_runs(plain, feeds)
    got_cm = _compiled_runs(fused, feeds)
    if isinstance(got_cm, Exception):
        assert isinstance(want_cm, Exception), f"{form} on CompiledModel: {got_cm}"
        return
    for (order, _, key), outputs in got_cm.items():
        assert_close(outputs, reference_runs[key], f"{form} {key} on CompiledModel, order {order}")


@pytest.mark.parametrize("form", QUANT_FORMS)
def test_quantized_forms_keep_the_contract(form):
    check_quantized(form)


def test_a_signature_naming_a_non_output_tensor_is_refused_not_aborted():
    """ai-edge-quantizer's static recipes leave a signature pointing at a
    tensor its subgraph no longer lists as an output; LiteRT's CompiledModel
    aborted the process on such a model.  fusekit refuses it by name, and
    a signature without its key too."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    def packed(m) -> bytes:
        b = flatbuffers.Builder(0)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    plain = (DATA / "torch" / "gen_decoder.tflite").read_bytes()
    model = schema.ModelT.InitFromPackedBuf(plain, 0)
    sig = model.signatureDefs[1]
    outputs = list(model.subgraphs[sig.subgraphIndex].outputs)
    inner = next(
        i for i in range(len(model.subgraphs[sig.subgraphIndex].tensors)) if i not in outputs
    )
    sig.outputs[0].tensorIndex = inner
    with pytest.raises(
        fusekit.RuntimeUnsafeModelError,
        match=rf"signature 1 \('decode'\) output 0 .* is tensor {inner}, which is "
        "not an output of subgraph",
    ):
        fusekit.CompiledModel.from_buffer(packed(model))
    model = schema.ModelT.InitFromPackedBuf(plain, 0)
    model.signatureDefs[0].signatureKey = None
    with pytest.raises(fusekit.FusekitError, match="signature 0 has no signature"):
        fusekit.CompiledModel.from_buffer(packed(model))


def test_blockwise_int4_scales_follow_their_tensor_after_optimize():
    """Blockwise quantization names its scales tensor by index; removing
    dead tensors must renumber it (LiteRT refused the fused int4 model:
    "Invalid scales tensor index in blockwise quantization")."""
    from ai_edge_litert import schema_py_generated as schema

    plain, fused, _ = quantized_case("gen_decoder:dynamic_wi4b32_afp32")

    def scales(model: bytes) -> list[np.ndarray]:
        m = schema.ModelT.InitFromPackedBuf(model, 0)
        out = []
        for sg in m.subgraphs:
            for t in sg.tensors:
                q = t.quantization
                if (
                    q is not None
                    and q.detailsType == schema.QuantizationDetails.BlockwiseQuantization
                ):
                    out.append(np.asarray(sg.tensors[q.details.scales].shape))
        return out

    assert scales(plain) and len(scales(fused)) == len(scales(plain))
    with fusekit.CompiledModel.from_buffer(fused) as cm:
        assert cm.get_num_signatures() == 2
