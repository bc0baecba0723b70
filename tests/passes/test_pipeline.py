"""The pass pipeline: registry, fixed-point loop, report, models written
with buffer offsets, control-flow bodies left untouched."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from pass_models import Builder, channels_first_cnn, convert_tf, count, random_inputs, run

import fusekit
from fusekit.passes import ModelView, PassError


@pytest.fixture(scope="module")
def cnn() -> bytes:
    return convert_tf(channels_first_cnn())


def test_builtin_passes_are_registered():
    assert {"cleanup", "layout", "space_to_depth"} <= set(fusekit.passes.available())


def test_the_registry_is_restored_after_a_failing_test():
    """What the pass_registry fixture does: a test that unregisters a
    built-in pass and registers its own, then fails, leaves the registry as
    it found it."""
    from pass_registry import restored

    before = {name: fusekit.passes.get(name) for name in fusekit.passes.available()}
    with pytest.raises(AssertionError, match="the test failed"), restored():
        fusekit.passes.unregister("layout")
        fusekit.passes.register("leftover_test")(lambda m, o: (m, []))
        raise AssertionError("the test failed")
    assert {name: fusekit.passes.get(name) for name in fusekit.passes.available()} == before


def test_a_user_pass_registers_and_runs_in_the_loop(cnn, pass_registry):
    seen = []

    @fusekit.passes.register("count_transposes_test")
    def count_transposes(model: ModelView, options):
        seen.append(sum(g.transpose_count() for g in model.graphs()))
        return model, []

    assert "count_transposes_test" in fusekit.passes.available()
    result = fusekit.optimize(cnn, passes=["layout", "count_transposes_test"])
    # First round: after layout; second round: nothing changed, fixed point.
    assert seen == [1, 1]
    assert result.report.line("count_transposes_test").changes == []
    with pytest.raises(PassError, match="already registered"):
        fusekit.passes.register("count_transposes_test")(lambda m, o: (m, []))
    fusekit.passes.unregister("count_transposes_test")
    assert "count_transposes_test" not in fusekit.passes.available()


def test_the_loop_stops_at_its_bound_and_says_so(cnn, pass_registry):
    @fusekit.passes.register("always_changes_test", replace=True)
    def always(model, options):
        return model, ["pretended change"]

    result = fusekit.optimize(cnn, passes=["always_changes_test"], max_iterations=3)
    assert result.report.iterations == 3
    assert not result.report.converged
    assert "stopped at the bound" in result.report.to_text()


def test_unknown_pass_and_bad_option_are_clear_errors(cnn):
    with pytest.raises(PassError, match="no pass named 'nope'; registered passes: .*layout"):
        fusekit.optimize(cnn, passes=["nope"])
    with pytest.raises(PassError, match="space_to_depth must be one of auto, on, off"):
        fusekit.optimize(cnn, space_to_depth="maybe")
    with pytest.raises(fusekit.InvalidModelError):
        fusekit.optimize(b"not a model at all, just some bytes", passes=["layout"])


def test_nothing_to_do_returns_the_same_bytes():
    b = Builder()
    x = b.input([1, 4, 4, 3])
    model = b.build([b.unary(fusekit.model.graph.OP.RELU, x)])
    result = fusekit.optimize(model, passes=["cleanup", "layout", "space_to_depth"])
    assert result.model is model
    assert result.report.iterations == 1 and result.report.converged


def test_report_has_a_line_per_pass_with_op_counts(cnn):
    report = fusekit.optimize(cnn, passes=["cleanup", "layout"]).report
    lines = report.lines()
    assert [line.split(":")[0] for line in lines] == ["cleanup", "layout"]
    layout = report.line("layout")
    assert layout.ops_before["TRANSPOSE"] == report.transposes_before
    assert layout.ops_after["TRANSPOSE"] == report.transposes_after
    assert f"TRANSPOSE {report.transposes_before}->1" in lines[1]
    assert report.to_dict()["passes"][1]["name"] == "layout"


def test_buffer_offset_models_keep_their_layout(tmp_path):
    """Weights stored after the flatbuffer (the converter's layout for
    models over 2 GB) stay there and the rewritten model matches."""
    model = convert_tf(channels_first_cnn(), _experimental_use_buffer_offset=True)
    original = ModelView(model)
    assert any(b.offset > 1 for b in original.m.buffers)
    result = fusekit.optimize(model, passes=["cleanup", "layout"])
    assert count(result.model, "TRANSPOSE") == 1
    rewritten = ModelView(result.model)
    offsets = [b for b in rewritten.m.buffers if b.offset > 1]
    assert offsets and all(b.offset + b.size <= len(result.model) for b in offsets)
    inputs = random_inputs(model)
    np.testing.assert_allclose(run(result.model, inputs)[0], run(model, inputs)[0], atol=1e-5)


def test_control_flow_bodies_are_left_untouched():
    @tf.function(input_signature=[tf.TensorSpec([1, 3, 4, 4], tf.float32)])
    def looped(x):
        def body(i, h):
            return i + 1, tf.nn.relu(h) * 0.5 - 0.25

        _, h = tf.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x])
        y = tf.transpose(h, [0, 2, 3, 1])
        return tf.transpose(tf.nn.relu(y), [0, 3, 1, 2])

    model = convert_tf(looped)
    before = ModelView(model)
    bodies = before.control_flow_bodies()
    assert bodies, "the converter kept no WHILE"
    result = fusekit.optimize(model, passes=["cleanup", "layout"])
    after = ModelView(result.model)
    assert result.report.untouched_subgraphs == bodies
    for index in bodies:
        old, new = before.m.subgraphs[index], after.m.subgraphs[index]
        assert len(old.operators) == len(new.operators)
        assert len(old.tensors) == len(new.tensors)
    assert "left untouched: subgraph(s)" in result.report.to_text()
    inputs = random_inputs(model)
    np.testing.assert_allclose(run(result.model, inputs)[0], run(model, inputs)[0], atol=1e-6)


def test_plus_and_minus_edit_the_default_passes():
    from fusekit.passes.pipeline import selected_passes

    defaults = list(fusekit.passes.DEFAULT_PASSES)
    assert selected_passes("+kv_cache_in_place", "auto") == [*defaults, "kv_cache_in_place"]
    assert selected_passes(["-layout", "+kv_cache_in_place"], "auto") == [
        *(n for n in defaults if n != "layout"),
        "kv_cache_in_place",
    ]
    assert selected_passes("+fuse", "auto") == defaults  # already there
    with pytest.raises(PassError, match="mix names"):
        selected_passes("layout,+kv_cache_in_place", "auto")
    with pytest.raises(PassError, match="removes a pass the default set does not hold"):
        selected_passes("-kv_cache_in_place", "auto")
    with pytest.raises(PassError, match="nope"):
        selected_passes("+nope", "auto")
    # A fusion of ``fuse`` named with a minus leaves the set as it is; the
    # run leaves that fusion out of ``fuse``.
    from fusekit.passes.pipeline import left_out

    assert selected_passes("-fuse_rotary", "auto") == defaults
    assert left_out("-fuse_rotary,+kv_cache_in_place") == ("fuse_rotary",)
    assert left_out(None) == () and left_out("-layout") == ()
