"""Which tests leave the default (fast) run, and for which tier.

    pytest                     the fast tier: what a developer runs after a change
    pytest -m slow             the slow tier (what the fast one leaves out)
    pytest -m fuzz tests/fuzz  the mutation fuzz run
    pytest -m bench            the benchmarks' quick runs
    pytest -m ""               every tier (CI, scripts/test.sh)
    bash scripts/sanitize.sh   the sanitize tier: kernel tests and fuzz on an ASan/UBSan build
    .venv-torch/bin/python -m pytest -m torch tests/torch
                               the torch tier: real litert-torch exports (scripts/setup_torch.sh
                               makes .venv-torch); other environments do not collect tests/torch

Kept in one table rather than as decorators in each file, with the time each
test took when the tiers were cut (2 shared cores, seconds, fixtures
included), so that a test moves between tiers in one place.  A test
parametrized over runtimes runs on ai-edge-litert in the fast tier and on
tf.lite and tflite-runtime (a subprocess in another venv) in the slow one.
"""

from __future__ import annotations

TIERS = ("slow", "fuzz", "bench", "sanitize", "torch")

# Runtimes whose parametrizations (a ``runtime`` parameter) are slow.
SLOW_RUNTIMES = frozenset({"tf", "tflite_runtime"})

# node id (without parameters: every parametrization) or a file -> tier.
MARKED: dict[str, str] = {
    # Real exports with litert-torch in .venv-torch (2.4 min at load 8).
    "tests/torch/test_torch_composite.py": "torch",  # 85 (plugin builds of 40)
    "tests/torch/test_torch_ops.py": "torch",  # 55 (packed_attention.py example: 20)
    "tests/torch/test_pytorch_doc.py": "torch",  # 30: docs/pytorch.md's walkthrough as written
    # Conversions of many or large models, sweeps over shapes.
    # Packed q, k, v read in place: five conversions run on every runtime,
    # and the zoo's packed-qkv models optimized and run.
    "tests/ops/test_attention_packed.py::test_parity_on_every_runtime": "slow",  # 25
    "tests/ops/test_attention_packed.py::test_parity_in_compiled_model": "slow",  # 8
    # q/k/v/out read and written through declared dims, on every runtime.
    "tests/ops/test_attention_shapes.py::test_every_runtime_reads_and_writes_through_the_dims": (
        "slow"
    ),  # 6
    "tests/passes/test_packed_operands.py::test_zoo_packed_qkv_is_read_in_place": "slow",  # 15
    "tests/ops/test_attention.py::test_converts_to_one_fused_op": "slow",  # 35
    "tests/ops/test_attention.py::test_float16_converts_with_float16_tensors": "slow",  # 22
    "tests/ops/test_attention.py::test_float16_at_every_simd_level": "slow",  # 4
    "tests/ops/test_attention.py::test_float16_conversions_are_exact": "slow",  # 4
    "tests/ops/test_attention.py::test_decode_shapes_match_float64": "slow",  # 6 conversions
    "tests/ops/test_group_norm.py::test_converts_to_one_fused_op": "slow",  # 18
    "tests/ops/test_group_norm.py::test_kernel_shape_sweep": "slow",  # 17
    "tests/ops/test_group_norm.py::test_traced_with_dynamic_batch_and_spatial_dims": "slow",  # 7
    "tests/ops/test_layer_norm.py::test_float16_parity": "slow",  # 9
    "tests/ops/test_layer_norm.py::test_one_custom_op_per_call_and_all_runtimes": "slow",  # 4
    "tests/ops/test_layer_norm_composite.py::test_converts_to_one_op_with_absent_inputs": (
        "slow"  # 12
    ),
    "tests/ops/test_layer_norm_composite.py::test_traced_with_dynamic_batch": "slow",  # 4
    "tests/ops/test_rms_norm.py::test_kernel_depth_sweep": "slow",  # 11
    "tests/ops/test_rms_norm.py::test_converts_to_one_fused_op": "slow",  # 8
    "tests/ops/test_rms_norm.py::test_traced_with_dynamic_batch": "slow",  # 4
    "tests/ops/test_rotary_embedding_composite.py::test_converts_to_one_fused_op": "slow",  # 12
    "tests/ops/test_rotary_embedding_composite.py::test_traced_with_dynamic_batch_and_sequence": (
        "slow"  # 5
    ),
    "tests/passes/test_fuse_keras_hub.py": "slow",  # 200: a dozen keras-hub backbones
    "tests/passes/test_kv_cache_pass.py::test_keras_hub_decode_step_in_place": "slow",  # 40
    "tests/ops/test_kv_cache_update.py::test_update_on_tflite_runtime": "slow",  # 4
    "tests/ops/test_kv_cache_update.py::"
    "test_compiled_model_computes_the_same_values_functionally": "slow",  # 2
    "tests/passes/test_cleanup.py::test_models_with_resource_variables_are_read": "slow",  # 16
    "tests/passes/test_space_to_depth.py::"
    "test_resnet_stem_becomes_a_stride_1_conv_over_12_channels": "slow",  # 13
    "tests/passes/test_fuse_norms.py::test_options_are_the_composites_bytes": "slow",  # 10
    "tests/passes/test_fuse_group_norm.py::test_options_are_the_composites_bytes": "slow",  # 8
    "tests/passes/test_fuse_rotary.py::test_options_are_the_composites_bytes": "slow",  # 8
    "tests/passes/test_fully_connected.py::test_bad_inputs_and_fuzz_never_crash": "slow",  # 10
    "tests/passes/test_fully_connected_f32.py::test_bad_inputs_and_fuzz_never_crash": "slow",
    "tests/test_convert_multi_output.py": "slow",  # 67: a model per output count and runtime
    "tests/test_calibration.py": "slow",  # 66: int8 calibration against TensorFlow's
    "tests/test_simd_levels.py::test_kernel_at_every_simd_level": "slow",  # 60
    "tests/test_keras_attention.py::"
    "test_converted_model_has_one_attention_op_per_layer_and_runs_everywhere": "slow",  # 7
    # Subprocesses: the command line as users run it, other venvs, compilers.
    "tests/test_cli.py::test_build_command": "slow",  # 38
    "tests/test_cli.py::test_verify_and_bench": "slow",  # 29
    "tests/test_cli.py::test_verify_and_bench_take_two_tflite_files": "slow",  # 21
    "tests/test_cli.py::test_a_kernel_error_during_verify_is_a_one_line_error": "slow",  # 20
    "tests/test_cli.py::test_verify_refuses_a_shape_it_cannot_apply": "slow",  # 3 x 6-17
    "tests/test_cli.py::test_convert_with_buffer_offsets": "slow",  # 12
    "tests/test_cli.py::test_quiet_convert_prints_nothing_on_stderr": "slow",  # 8
    "tests/test_verify_signatures.py::test_cli_verify_and_bench_every_signature": "slow",  # 10
    "tests/test_abi_behaviour.py": "slow",  # 54: a probe plugin on every runtime
    "tests/test_threads.py": "slow",  # 46 (litert only; 3 runtimes: ~120)
    "tests/test_user_plugin.py": "slow",  # 139: compiles plugins
    "tests/test_examples.py": "slow",  # 88: five examples as subprocesses
    "tests/test_sdk_checks.py": "slow",  # 50: compiles a plugin
    # Compiles two plugins and runs each op in worker processes.
    "tests/test_opcheck.py::test_a_correct_user_op_passes_every_check": "slow",  # 20
    "tests/test_opcheck.py::test_a_kernel_whose_threads_change_the_bits_fails_the_thread_check": (
        "slow"  # 5
    ),
    "tests/test_opcheck.py::test_a_kernel_that_crashes_on_a_bad_shape_fails_and_the_caller_lives": (
        "slow"  # 5
    ),
    "tests/test_opcheck.py::test_a_numpy_reference_stands_in_for_tensorflow": "slow",  # 4
    "tests/test_opcheck.py::test_wrong_arguments_are_named": "slow",  # 3
    "tests/test_plugin_loading.py::test_a_user_plugin_through_symlink_relative_and_hard_link": (
        "slow"  # 15
    ),
    "tests/test_model_check.py::test_byte_flipped_models_never_crash_tflite_runtime": "slow",
    "tests/test_runtime_deps.py::"
    "test_fusekit_runs_a_model_on_tflite_runtime_without_litert_or_tensorflow": "slow",  # 7
    # LiteRT's CompiledModel and C apps: every op and case through another
    # API, a leak check over 1,000 cycles, CMake and Bazel builds of the C app.
    "tests/test_compiled_model.py": "slow",  # 210
    "tests/test_c_app.py": "slow",  # 150
    # The contract over every committed litert-torch fixture.
    "tests/test_contract.py::test_compiled_model_every_fixture": "slow",  # 15
    "tests/test_contract.py::test_interpreters_every_fixture": "slow",  # 15
    # ... and over quantized forms (cached under build/contract_quant).
    "tests/test_contract.py::test_quantized_forms_keep_the_contract": "slow",  # 145 at load 12
    # 10 s:
    "tests/test_contract.py::test_blockwise_int4_scales_follow_their_tensor_after_optimize": "slow",
    "tests/passes/test_compiled_keras_hub.py": "slow",  # 20
    # Quantized conversions (representative datasets) and ai-edge-quantizer recipes.
    "tests/passes/test_fuse_quantized.py": "slow",  # 70
    "tests/test_quantized_convert.py": "slow",  # 20
    # keras-hub causal LMs exported as prefill/decode steps, greedy generation.
    "tests/test_generation.py": "slow",  # 34
    # Greedy and teacher-forced generation of three weight forms (ai-edge-quantizer).
    "tests/test_generation_check.py": "slow",  # 5 (CPU time; 54 s of wall at load 12)
    "tests/passes/test_decode_step.py": "slow",
    "tests/passes/test_fuse_composites.py": "slow",
    # bench-generate measuring the memory bandwidth (a ring of about 1 GB).
    "tests/test_generation_bench.py::test_the_floor_with_the_measured_bandwidth": "slow",  # 10
    # The mutation fuzz run (its builder check stays in the fast tier).
    "tests/fuzz/test_fuzz.py::test_fuzz": "fuzz",
    "tests/fuzz/test_fuzz.py::test_regressions_replay": "fuzz",
    # The benchmarks' quick runs.
    "tests/test_benchmarks.py": "bench",
    "tests/test_bench_model_reading.py": "bench",
    "tests/test_bench_composites.py": "bench",
}
