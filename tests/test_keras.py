"""fusekit.keras: the drop-in norm layers against Keras' own, their
serialization, fuse() on Sequential / Functional / nested models, its
report, fallbacks, and the converted model's fused ops."""

from __future__ import annotations

import importlib
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import fusekit
import fusekit.keras as fk

TOL = 1e-5


def _randomize(model_or_layer, seed=0):
    """Non-trivial weights (gamma around 1, beta around 0) so a swapped
    gamma/beta or a wrong weight order shows."""
    rng = np.random.default_rng(seed)
    for w in model_or_layer.weights:
        base = 1.0 if w.name in ("gamma", "scale") else 0.0
        w.assign((base + 0.5 * rng.standard_normal(w.shape)).astype(np.float32))


def _pair(cls_name, config, shape, seed=0):
    """(Keras layer, drop-in) built for ``shape`` with the same weights."""
    ours = getattr(fk, cls_name)(**config)
    theirs = getattr(keras.layers, cls_name)(**config)
    theirs.build(shape)
    _randomize(theirs, seed)
    ours.build(shape)
    ours.set_weights(theirs.get_weights())
    return theirs, ours


def _no_warnings(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return fn(*args)


# ------------------------------------------------------------------ drop-ins

LN_CASES = [
    ({}, (4, 7)),
    ({"epsilon": 1e-6}, (2, 3, 16)),
    ({"center": False}, (1, 5, 1, 33)),
    ({"scale": False}, (3, 1)),
    ({"center": False, "scale": False}, (2, 2, 9)),
    ({"axis": 2}, (2, 3, 12)),  # the last axis, by position
    ({"axis": [-1], "epsilon": 0.1}, (1, 768)),
]
RMS_CASES = [
    ({}, (4, 7)),
    ({"epsilon": 1e-3}, (2, 3, 16)),
    ({"axis": 3}, (1, 5, 1, 33)),
    ({}, (3, 1)),
    ({}, (1, 2, 4097)),
]
GN_CASES = [
    ({}, (2, 64)),  # groups=32 default
    ({"groups": 4}, (2, 5, 12)),
    ({"groups": -1}, (1, 4, 4, 6)),  # instance norm
    ({"groups": 1, "epsilon": 1e-5}, (3, 2, 3, 4, 8)),
    ({"groups": 2, "center": False}, (2, 7, 4)),
    ({"groups": 3, "scale": False}, (1, 3, 3, 9)),
    ({"groups": 8, "center": False, "scale": False, "axis": 3}, (2, 2, 2, 16)),
]
PARITY = (
    [("LayerNormalization", c, s) for c, s in LN_CASES]
    + [("RMSNormalization", c, s) for c, s in RMS_CASES]
    + [("GroupNormalization", c, s) for c, s in GN_CASES]
)


@pytest.mark.parametrize("cls_name, config, shape", PARITY, ids=str)
def test_drop_in_matches_keras(cls_name, config, shape):
    theirs, ours = _pair(cls_name, config, shape, seed=len(shape))
    assert ours.why_not_fused(shape, "float32") is None
    assert [(w.name, tuple(w.shape)) for w in ours.weights] == [
        (w.name, tuple(w.shape)) for w in theirs.weights
    ]
    rng = np.random.default_rng(7)
    for batch in (shape[0], 1, 5):
        x = (rng.standard_normal((batch,) + shape[1:]) * 2 + 0.5).astype(np.float32)
        got = _no_warnings(ours, x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(theirs(x)), rtol=TOL, atol=TOL)


def test_drop_in_in_a_traced_function_with_dynamic_batch():
    theirs, ours = _pair("LayerNormalization", {}, (None, 6, 24))

    @tf.function(input_signature=[tf.TensorSpec([None, 6, 24], tf.float32)])
    def f(x):
        return ours(x)

    graph = f.get_concrete_function().graph.as_graph_def()
    implements = [
        fn.attr["_implements"].func.name
        for fn in graph.library.function
        if "_implements" in fn.attr
    ]
    assert implements == ["fusekit_layer_norm"]
    for batch in (1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 6, 24)).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), np.asarray(theirs(x)), atol=TOL)


def test_gradients_match_keras():
    theirs, ours = _pair("GroupNormalization", {"groups": 2}, (2, 3, 8))
    x = tf.constant(np.random.default_rng(3).standard_normal((2, 3, 8)).astype(np.float32))
    grads = []
    for layer in (theirs, ours):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x) * tf.range(8.0))
        grads.append(tape.gradient(loss, [x, *layer.trainable_weights]))
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_defaults_are_keras_defaults():
    for name in ("LayerNormalization", "RMSNormalization", "GroupNormalization"):
        ours = getattr(fk, name)().get_config()
        theirs = getattr(keras.layers, name)().get_config()
        ours.pop("name"), theirs.pop("name")
        assert ours == theirs, name
    assert fk.LayerNormalization().epsilon == 1e-3
    assert fk.RMSNormalization().epsilon == 1e-6
    gn = fk.GroupNormalization()
    assert (gn.groups, gn.epsilon, gn.center, gn.scale) == (32, 1e-3, True, True)


def test_keras_weights_load_into_drop_ins(tmp_path):
    def build(layers_module):
        inp = keras.Input((5, 16))
        h = layers_module.LayerNormalization(center=False)(inp)
        h = layers_module.RMSNormalization()(h)
        h = layers_module.GroupNormalization(groups=4)(h)
        return keras.Model(inp, h)

    original = build(keras.layers)
    _randomize(original)
    original.save_weights(tmp_path / "w.weights.h5")
    ours = build(fk)
    ours.load_weights(tmp_path / "w.weights.h5")
    x = np.random.default_rng(0).standard_normal((3, 5, 16)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(original(x)), atol=TOL)


def test_keras_file_round_trip(tmp_path):
    inp = keras.Input((None, 16))
    h = fk.LayerNormalization(epsilon=1e-5, scale=False)(inp)
    h = fk.RMSNormalization(epsilon=1e-4)(h)
    h = fk.GroupNormalization(groups=-1)(h)
    model = keras.Model(inp, h)
    _randomize(model)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert [type(layer) for layer in loaded.layers[1:]] == [
        fk.LayerNormalization,
        fk.RMSNormalization,
        fk.GroupNormalization,
    ]
    assert loaded.layers[1].get_config() == model.layers[1].get_config()
    assert loaded.layers[3].groups == 16
    x = np.random.default_rng(1).standard_normal((2, 7, 16)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), atol=1e-6)


def test_registered_names():
    for cls in (fk.LayerNormalization, fk.RMSNormalization, fk.GroupNormalization):
        assert keras.saving.get_registered_name(cls) == f"fusekit>{cls.__name__}"
        assert keras.saving.get_registered_object(f"fusekit>{cls.__name__}") is cls


def test_lazy_attribute():
    assert "keras" in fusekit._LAZY
    assert fusekit.keras is importlib.import_module("fusekit.keras")
    assert fusekit.keras.fuse is fk.fuse


# ----------------------------------------------------------------- fallbacks

FALLBACKS = [
    ("LayerNormalization", {"axis": 1}, (2, 3, 8), "is not the last axis"),
    ("LayerNormalization", {"axis": (1, 2)}, (2, 3, 8), "several axes"),
    ("LayerNormalization", {"rms_scaling": True}, (2, 8), "rms_scaling=True"),
    ("RMSNormalization", {"axis": [1, 2]}, (2, 3, 8), "several axes"),
    ("RMSNormalization", {"axis": -2}, (2, 8, 8), "is not the last axis"),
    ("GroupNormalization", {"groups": 2, "axis": 1}, (2, 4, 3), "is not the last axis"),
    ("GroupNormalization", {"groups": 2}, (1, 2, 2, 2, 2, 4), "rank 6"),
    ("LayerNormalization", {"dtype": "mixed_float16"}, (2, 8), "compute dtype float16"),
]


@pytest.mark.parametrize("cls_name, config, shape, reason", FALLBACKS, ids=str)
def test_fallback_warns_once_per_instance_and_matches_keras(cls_name, config, shape, reason):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Keras' rms_scaling notice
        theirs, ours = _pair(cls_name, config, shape)
    assert reason in ours.why_not_fused(shape, None)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = ours(x), ours(x)
    mine = [w for w in caught if "fusekit.keras" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert reason in str(mine[0].message) and repr(ours.name) in str(mine[0].message)
    tol = 1e-2 if "float16" in reason else TOL
    for y in (first, second):
        np.testing.assert_allclose(np.asarray(y), np.asarray(theirs(x)), rtol=tol, atol=tol)
    # A second instance warns for itself.
    _, other = _pair(cls_name, config, shape)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other(x)
    assert sum("fusekit.keras" in str(w.message) for w in caught) == 1


def test_float64_input_falls_back():
    _, ours = _pair("RMSNormalization", {"dtype": "float64"}, (2, 8))
    with pytest.warns(UserWarning, match="compute dtype float64"):
        ours(np.ones((2, 8)))


# ---------------------------------------------------------------------- fuse


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _assert_same_outputs(a, b, x):
    ya, yb = a(x), b(x)
    ya = ya if isinstance(ya, (list, tuple)) else [ya]
    yb = yb if isinstance(yb, (list, tuple)) else [yb]
    for p, q in zip(ya, yb, strict=True):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=TOL, atol=TOL)


def _classes(report, which):
    return {e.path: e for e in getattr(report, which)}


def test_fuse_sequential():
    model = keras.Sequential(
        [
            keras.Input((6, 16)),
            keras.layers.Dense(16),
            keras.layers.LayerNormalization(name="ln"),
            keras.layers.RMSNormalization(name="rms"),
            keras.layers.Reshape((6, 2, 8)),
            keras.layers.GroupNormalization(groups=4, name="gn"),
        ]
    )
    _randomize(model)
    fused = fk.fuse(model, verbose=False)
    assert fused is not model and isinstance(fused, keras.Sequential)
    assert [type(layer) for layer in fused.layers] == [
        keras.layers.Dense,
        fk.LayerNormalization,
        fk.RMSNormalization,
        keras.layers.Reshape,
        fk.GroupNormalization,
    ]
    assert type(fused.get_layer("ln")) is fk.LayerNormalization
    assert type(fused.get_layer("gn")) is fk.GroupNormalization
    # The original is untouched and owns its own weights.
    assert type(model.get_layer("ln")) is keras.layers.LayerNormalization
    assert not any(a is b for a, b in zip(model.weights, fused.weights, strict=True))
    _assert_same_outputs(model, fused, _x((3, 6, 16)))
    assert sorted(_classes(fused.fusekit_report, "swapped")) == ["gn", "ln", "rms"]
    assert fused.fusekit_report.left == []


@pytest.mark.filterwarnings("ignore:You passed `rms_scaling=True`")
def test_fuse_functional_with_report(capsys):
    inp = keras.Input((5, 32))
    h = keras.layers.LayerNormalization(name="ln_last")(inp)
    h = keras.layers.LayerNormalization(axis=(1, 2), name="ln_two_axes")(h)
    h = keras.layers.RMSNormalization(name="rms")(h)
    h2 = keras.layers.GroupNormalization(groups=8, name="gn")(h)
    h3 = keras.layers.LayerNormalization(rms_scaling=True, name="ln_rms_scaling")(h)
    model = keras.Model(inp, [h2, h3])
    _randomize(model)
    fused = fk.fuse(model)
    printed = capsys.readouterr().out
    report = fused.fusekit_report
    swapped, left = _classes(report, "swapped"), _classes(report, "left")
    assert sorted(swapped) == ["gn", "ln_last", "rms"]
    assert swapped["ln_last"].keras_class == "keras.layers.LayerNormalization"
    assert swapped["ln_last"].drop_in == "fusekit.keras.LayerNormalization"
    assert swapped["gn"].drop_in == "fusekit.keras.GroupNormalization"
    assert sorted(left) == ["ln_rms_scaling", "ln_two_axes"]
    assert "axis=(1, 2)" in left["ln_two_axes"].reason
    assert "rms_scaling=True" in left["ln_rms_scaling"].reason
    assert type(fused.get_layer("ln_two_axes")) is keras.layers.LayerNormalization
    assert printed.strip() == report.to_text()
    assert "swapped 3, left 2" in printed and "ln_two_axes" in printed
    _assert_same_outputs(model, fused, _x((2, 5, 32)))


@keras.saving.register_keras_serializable(package="fusekit_tests")
class Block(keras.layers.Layer):
    """A custom layer holding norm layers as an attribute and in a list."""

    def __init__(self, units: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6, name="attr_ln")
        self.norms = [
            keras.layers.RMSNormalization(name="list_rms"),
            keras.layers.LayerNormalization(center=False, name="list_ln"),
        ]

    def build(self, input_shape):
        self.dense.build(input_shape)
        shape = (*input_shape[:-1], self.units)
        self.norm.build(shape)
        for norm in self.norms:
            norm.build(shape)

    def call(self, x):
        y = self.norm(self.dense(x))
        for norm in self.norms:
            y = norm(y)
        return y

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class DoubledLN(keras.layers.LayerNormalization):
    def call(self, inputs):
        return super().call(inputs) * 2.0


class QuietLN(keras.layers.LayerNormalization):
    """A subclass that does not override call."""


def _nested_model():
    inner_in = keras.Input((5, 16))
    inner = keras.Model(
        inner_in, keras.layers.GroupNormalization(groups=4, name="inner_gn")(inner_in), name="inner"
    )
    seq = keras.Sequential(
        [
            keras.Input((5, 16)),
            keras.layers.LayerNormalization(name="seq_ln"),
            DoubledLN(name="doubled"),
            QuietLN(name="quiet"),
        ],
        name="seq",
    )
    inp = keras.Input((5, 16))
    model = keras.Model(inp, seq(Block(name="block")(inner(inp))), name="outer")
    _randomize(model)
    return model


def test_fuse_nested_models_and_custom_layers():
    model = _nested_model()
    fused = fk.fuse(model, verbose=False)
    report = fused.fusekit_report
    swapped, left = _classes(report, "swapped"), _classes(report, "left")
    assert sorted(swapped) == [
        "block/attr_ln",
        "block/list_ln",
        "block/list_rms",
        "inner/inner_gn",
        "seq/seq_ln",
    ]
    assert "overrides call" in left["seq/doubled"].reason
    assert "only the standard class is swapped" in left["seq/quiet"].reason
    assert left["seq/doubled"].keras_class.endswith("DoubledLN")
    block = fused.get_layer("block")
    assert type(block.norm) is fk.LayerNormalization
    assert [type(n) for n in block.norms] == [fk.RMSNormalization, fk.LayerNormalization]
    assert type(model.get_layer("block").norm) is keras.layers.LayerNormalization
    _assert_same_outputs(model, fused, _x((3, 5, 16)))
    # Fusing again: graph layers are drop-ins already; the custom layer's
    # copy (from its config) holds standard layers again, swapped again.
    again = fk.fuse(fused, verbose=False).fusekit_report
    assert sorted(e.path for e in again.swapped) == sorted(p for p in swapped if "block/" in p)
    already = [e.path for e in again.left if e.reason == "already a fusekit drop-in"]
    assert sorted(already) == ["inner/inner_gn", "seq/seq_ln"]


def test_shared_layer_is_swapped_once():
    norm = keras.layers.LayerNormalization(name="shared")
    a, b = keras.Input((8,)), keras.Input((8,))
    model = keras.Model([a, b], [norm(a), norm(b)])
    _randomize(model)
    fused = fk.fuse(model, verbose=False)
    assert [e.path for e in fused.fusekit_report.swapped] == ["shared"]
    _assert_same_outputs(model, fused, [_x((2, 8), 1), _x((3, 8), 2)])


def test_fuse_registry_takes_new_swaps():
    seen = []

    def swap(layer):
        seen.append(layer.name)
        return "test swap: not fusable"

    fk.register_swap(keras.layers.UnitNormalization, swap)
    try:
        model = keras.Sequential([keras.Input((4,)), keras.layers.UnitNormalization(name="unit")])
        report = fk.fuse(model, verbose=False).fusekit_report
    finally:
        del fk.SWAPS[keras.layers.UnitNormalization]
    assert seen == ["unit"]
    assert [(e.path, e.reason) for e in report.left] == [("unit", "test swap: not fusable")]


@keras.saving.register_keras_serializable(package="fusekit_tests")
class Net(keras.Model):
    """A subclassed model (copied through its config, not clone_model)."""

    def __init__(self, units: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)
        self.norm = keras.layers.LayerNormalization()  # automatic name

    def call(self, x):
        return self.norm(self.dense(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def test_fuse_subclassed_model_reports_original_names():
    model = Net()
    x = _x((2, 8))
    model(x)
    _randomize(model)
    fused = fk.fuse(model, verbose=False)
    assert type(fused) is Net and type(fused.norm) is fk.LayerNormalization
    # The copy's layer got a new automatic name; the report names the original's.
    assert [e.path for e in fused.fusekit_report.swapped] == [model.norm.name]
    _assert_same_outputs(model, fused, x)


def test_fuse_rejects_non_models():
    with pytest.raises(TypeError, match="takes a keras.Model"):
        fk.fuse(keras.layers.LayerNormalization())


# ---------------------------------------------------------------- conversion


def test_converted_fused_model_has_one_op_per_norm_layer():
    inp = keras.Input((5, 32))
    h = keras.layers.LayerNormalization()(inp)
    h = keras.layers.Dense(32)(h)
    h = keras.layers.LayerNormalization(center=False)(h)
    h = keras.layers.RMSNormalization()(h)
    h = keras.layers.GroupNormalization(groups=8)(h)
    h = keras.layers.GroupNormalization(groups=4, scale=False)(h)
    h = keras.layers.LayerNormalization(axis=(1, 2))(h)  # stays Keras: no fused op
    model = keras.Model(inp, h)
    _randomize(model)
    fused = fk.fuse(model, verbose=False)
    result = fusekit.convert(fused)
    counts = fusekit.model.model_ops.op_counts(result.model)
    assert {k: v for k, v in counts.items() if k.startswith("CUSTOM:")} == {
        "CUSTOM:fusekit_layer_norm": 2,
        "CUSTOM:fusekit_rms_norm": 1,
        "CUSTOM:fusekit_group_norm": 2,
    }
    assert result.report.fused == {
        "fusekit_group_norm": 2,
        "fusekit_layer_norm": 2,
        "fusekit_rms_norm": 1,
    }
    assert len(fused.fusekit_report.swapped) == 5 and len(fused.fusekit_report.left) == 1
