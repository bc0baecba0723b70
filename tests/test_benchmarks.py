"""Every benchmark runs end to end (--quick: tiny shapes, few rounds).

Timings are not asserted (speed targets live in the benchmark's own
report); what is checked is that every op is measured against each of its
peers, that the fused, unfused and ONNX Runtime outputs agree, and that the
table, the JSON and the chart are written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPS = {"layer_norm", "rms_norm", "group_norm", "rotary_embedding"}


def run_quick(script: str, out: Path, *written: str, args: tuple[str, ...] = ()) -> dict:
    """Runs ``benchmarks/<script> --quick --out out [args]``; checks that the
    named files were written and returns the JSON one (the first)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in written:
        assert (out / name).stat().st_size > 0, name
    return json.loads((out / written[0]).read_text())


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    run_quick("bench_norms.py", out, "norms.json")
    return out


def test_quick_run_writes_table_json_and_chart(quick_run):
    for name in ("norms.md", "norms.json", "norms.png"):
        assert (quick_run / name).stat().st_size > 0, name
    markdown = (quick_run / "norms.md").read_text()
    for op in OPS:
        assert op in markdown


def test_every_op_is_timed_against_its_peers_and_agrees_with_them(quick_run):
    payload = json.loads((quick_run / "norms.json").read_text())
    assert not payload["skipped"], payload["skipped"]
    results = payload["results"]
    assert {r["op"] for r in results} == OPS
    threads = payload["settings"]["threads"]
    for r in results:
        where = f"{r['op']} {r['shape']}"
        # The copy floor is one memcpy, timed once.
        wanted = [f"{peer}@{t}" for peer in ("fused", "unfused") for t in threads] + ["copy@1"]
        for key in wanted:
            assert r["medians_us"].get(key, 0) > 0, f"{where}: no {key}"
        for peer, diff in r["max_abs_diff"].items():
            assert diff < 1e-3, f"{where}: fused and {peer} differ by {diff}"


def test_conversion_benchmark_quick_run(tmp_path):
    payload = run_quick("bench_conversion.py", tmp_path, "conversion.json")
    (row,) = payload["results"]
    assert row["plain_s"] > 0 and row["fusekit_s"] > 0
    assert row["ratio"] == pytest.approx(row["fusekit_s"] / row["plain_s"])
    assert set(row["fusekit_stages_s"]) >= {"plan", "convert", "passes", "verify"}
    assert "| small |" in (tmp_path / "conversion.md").read_text()


def test_passes_benchmark_quick_run(tmp_path):
    """bench_passes.py --quick: every variant of both models timed, outputs
    equal to the original's, the layout variant down to one transpose, the
    table, JSON and chart written."""
    payload = run_quick("bench_passes.py", tmp_path, "passes.json", "passes.md", "passes.png")
    results = {r["model"]: {row["variant"]: row for row in r["rows"]} for r in payload["results"]}
    assert set(results) == {"resnet18_cf", "stem"}
    for model, rows in results.items():
        assert set(rows) == {
            "original",
            "cleanup",
            "layout",
            "fold_affine",
            "layout+fold_affine",
            "space_to_depth",
            "default",
        }
        for variant, row in rows.items():
            assert row["median_us"] > 0 and row["max_abs_diff"] < 1e-4, (model, variant)
    assert results["resnet18_cf"]["original"]["transposes"] > 30
    assert results["resnet18_cf"]["layout"]["transposes"] == 1
    assert results["stem"]["space_to_depth"]["changed"]
    assert not results["stem"]["default"]["changed"]  # auto declines on CPU
    assert "| resnet18_cf [1, 3, 64, 64] | layout | 1 |" in (tmp_path / "passes.md").read_text()


def test_encoder_benchmark_quick_run(tmp_path):
    payload = run_quick("bench_encoder.py", tmp_path, "encoder.json", "encoder.md", "encoder.png")
    fused = {m["name"]: m["fusekit_fused"] for m in payload["models"]}
    assert fused == {
        "encoder": {"fusekit_attention": 1, "fusekit_layer_norm": 2},
        "decoder": {"fusekit_attention": 1, "fusekit_rms_norm": 3, "fusekit_rotary_embedding": 2},
    }
    assert {r["model"] for r in payload["results"]} == {"encoder", "decoder"}
    for row in payload["results"]:
        for engine in ("plain", "fused", "ort"):
            assert row["median_ms"][engine] > 0, engine
            assert row["max_abs_diff"][engine] < 1e-4, (engine, row["max_abs_diff"])


def test_attention_benchmark_quick_run(tmp_path):
    payload = run_quick(
        "bench_attention.py", tmp_path, "attention.json", "attention.md", "attention.png"
    )
    threads = payload["settings"]["threads"]
    roles = set()
    for r in payload["results"]:
        where = r["shape"]["label"]
        roles.add(r["shape"]["role"])
        for key in [f"{m}@{t}" for m in ("fused", "unfused") for t in threads]:
            assert r["medians_us"].get(key, 0) > 0, f"{where}: no {key}"
            # fused and unfused both agree with the TensorFlow composite
            assert r["max_abs_diff_vs_tf"][key] < 1e-4, f"{where}: {key} off TensorFlow"
        if r["shape"]["role"] == "decode":
            assert r["medians_us"]["copy@1"] > 0, f"{where}: no copy floor"
    assert roles == {"prefill", "decode"}
    memory = payload["peak_memory"]
    assert memory["fused"]["peak_mib"] > 0 and memory["unfused"]["peak_mib"] > 0
    assert "## Peak memory" in (tmp_path / "attention.md").read_text()
    # The KV-cache layout rows: every layout timed, equal to the default's output.
    layouts = json.loads((tmp_path / "attention_layouts.json").read_text())
    for r in layouts["results"]:
        assert r["floor_us"] > 0
        timed = {k for k in r["medians_us"] if k != "copy@1"}
        assert {k.split("@")[0] for k in timed} == {
            "k=bshd v=bshd",
            "k=bhsd v=bhds",
            "k=bhsd v=bhsd",
        }
        assert all(r["medians_us"][k] > 0 for k in timed)
        assert max(r["max_abs_diff_vs_default"].values()) < 1e-5


def test_fusion_benchmark_quick_run(tmp_path):
    """An encoder, a decoder and ViT (its token count follows its image):
    tests/passes/test_fuse_keras_hub.py holds the fusion of every family."""
    payload = run_quick(
        "bench_fusion.py",
        tmp_path,
        "fusion.json",
        "fusion.md",
        "fusion.png",
        args=("--families", "bert,llama,vit"),
    )
    rows = {r["family"]: r for r in payload["results"]}
    assert set(rows) == {"bert", "llama", "vit"}
    layers = 4
    attention = {"CUSTOM:fusekit_attention": layers}
    encoder = attention | {"CUSTOM:fusekit_layer_norm": 2 * layers + 1}
    decoder = attention | {
        "CUSTOM:fusekit_rms_norm": 2 * layers + 1,
        "CUSTOM:fusekit_rotary_embedding": 2 * layers,
    }
    assert rows["bert"]["fused"] == rows["vit"]["fused"] == encoder
    assert rows["llama"]["fused"] == decoder
    # --quick asks for 32 tokens: ViT gets 5x5 patches of 16 pixels plus its
    # class token, and the table shows those 26.
    assert rows["vit"]["seq"] == 26 and rows["vit"]["input_shapes"] == [[1, 80, 80, 3]]
    assert "| vit | 26 |" in (tmp_path / "fusion.md").read_text()
    for row in rows.values():
        assert row["max_abs_diff"] < 1e-4, row
        assert row["median_ms"]["plain"] > 0 and row["median_ms"]["optimized"] > 0


def test_generate_benchmark_quick_run(tmp_path):
    payload = run_quick("bench_generate.py", tmp_path, "generate.json", "generate.md")
    (row,) = payload["results"]
    assert row["fused"] == {
        "CUSTOM:fusekit_attention": 2,
        "CUSTOM:fusekit_rms_norm": 5,
        "CUSTOM:fusekit_rotary_embedding": 4,
    }
    assert row["fused_in_place"] == {
        **row["fused"],
        "CUSTOM:fusekit_kv_cache_update": 4,
    }
    assert row["max_abs_diff"] < 1e-4
    timed = ("plain", "optimized", "in_place", "floor_warm", "floor_evicted")
    assert all(row["median_ms"][v] > 0 for v in timed)
    # The floor reads the weights and, at position L - 1, the whole cache;
    # the one the step is held to is the warm one where that fits in the
    # last-level cache.
    assert row["read_mib"] == pytest.approx(row["weights_mib"] + row["cache_mib"])
    fits = row["fits_last_level_cache"]
    assert row["median_ms"]["floor"] == row["median_ms"]["floor_warm" if fits else "floor_evicted"]
    assert ("yes: warm" if fits else "no: evicted") in (tmp_path / "generate.md").read_text()
    # The functional cache moves several caches per step; in place, the
    # operators write less than one cache (the rows, the activations).
    written = row["written_mib"]
    assert written["optimized"] >= 3 * row["cache_mib"]
    assert written["in_place"] < row["cache_mib"]
    assert (tmp_path / "generate.png").stat().st_size > 0


def test_decode_loop_benchmark_quick_run(tmp_path):
    """bench_decode_loop.py --quick: bytes written per step counted (the
    functional cache's operators, get/set vs DecodeLoop's rows) and every
    way of carrying the cache timed."""
    payload = run_quick("bench_decode_loop.py", tmp_path, "decode_loop.json", "decode_loop.md")
    (row,) = payload["rows"]
    assert row["python_bytes_written"]["get/set"] == 2 * row["cache_bytes"]
    # One position of the [1, 2, 2, 64, 2, 16] cache.
    assert row["python_bytes_written"]["DecodeLoop"] == row["cache_bytes"] // 64
    assert row["model_bytes_written"]["cache_moves"] >= 3 * row["cache_bytes"]
    # In place: no cache-sized operator output, nothing copied in Python.
    assert row["in_place_model_bytes_written"]["cache_moves"] == 0
    assert row["in_place_model_bytes_written"]["all_ops"] < row["cache_bytes"]
    assert row["python_bytes_written"]["in place: DecodeLoop"] == 0
    timed = {"invoke", "get/set", "runner", "DecodeLoop", "cache get+set", "in place: DecodeLoop"}
    assert set(row["cpu_median_us"]) == timed


def test_lifetimes_benchmark_reports_every_kernel_on_every_runtime(tmp_path):
    from runtimes import RUNTIMES

    import fusekit

    payload = run_quick("bench_lifetimes.py", tmp_path, "lifetimes.json", "lifetimes.md")
    rows = payload["rows"]
    assert {(r["runtime"], r["op"]) for r in rows} == {
        (runtime, op) for runtime in RUNTIMES for op in fusekit.kernel_names()
    }
    assert [r for r in rows if r["error"]] == []
    assert payload["budget_mib"] > 0 and isinstance(payload["over_budget"], list)


def test_torch_fusion_benchmark_quick_run(tmp_path):
    """On the committed Hugging Face Llama and BERT fixtures (no torch
    needed): every norm, rotary and attention the manifest counts is fused,
    the outputs agree, and fusion.md gets the PyTorch section."""
    payload = run_quick(
        "bench_fusion_torch.py", tmp_path, "fusion_torch.json", "fusion.md", "fusion_torch.png"
    )
    rows = {r["family"]: r for r in payload["results"]}
    assert set(rows) == {"hf_llama", "hf_bert"}
    op = {"rotary": "fusekit_rotary_embedding"}
    for row in rows.values():
        assert row["fused"] == {op.get(k, f"fusekit_{k}"): v for k, v in row["expected"].items()}
        assert row["max_abs_diff"] < 1e-4 and row["max_abs_diff_vs_torch"] < 1e-4, row
        assert row["median_ms"]["plain"] > 0 and row["median_ms"]["optimized"] > 0
    assert "| hf_bert | 16 |" in (tmp_path / "fusion.md").read_text()


def test_fusion_benchmarks_share_fusion_md(tmp_path):
    """bench_fusion.py rewrites its keras-hub table and keeps the PyTorch
    section below it; bench_fusion_torch.py replaces only that section."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_fusion
    import bench_fusion_torch

    md = tmp_path / "fusion.md"
    bench_fusion_torch.write_section(md, [bench_fusion_torch.SECTION, "", "torch table 1"])
    row = {
        "family": "bert",
        "seq": 8,
        "requested_seq": 8,
        "threads": 1,
        "fused": {"CUSTOM:fusekit_attention": 1},
        "median_ms": {"plain": 2.0, "optimized": 1.0},
        "peak_mib": {"plain": 1.0, "optimized": 1.0},
        "max_abs_diff": 0.0,
    }
    payload = {"model": "m", "machine": "x", "date": "d", "commit": "c", "results": [row]}
    bench_fusion.write(tmp_path, payload)
    text = md.read_text()
    assert text.index("| bert | 8 |") < text.index(bench_fusion_torch.SECTION)
    assert "torch table 1" in text
    bench_fusion_torch.write_section(md, [bench_fusion_torch.SECTION, "", "torch table 2"])
    text = md.read_text()
    assert "| bert | 8 |" in text and "torch table 2" in text and "torch table 1" not in text


def test_quantized_benchmark_quick_run(tmp_path):
    """BERT at S=32 in float32, the converter's int8 and fusekit.convert's
    int8: every form fully fused, the fused int8 models closer to the float
    Keras model than the plain int8 one, fusekit.convert's the closest."""
    forms = "float32,dynamic,int8,fk_int8"
    payload = run_quick(
        "bench_quantized.py",
        tmp_path,
        "quantized.json",
        "quantized.md",
        "quantized.png",
        args=("--families", "bert", "--forms", forms),
    )
    rows = {(r["form"], r["variant"]): r for r in payload["results"]}
    assert len(rows) == 8
    for form in forms.split(","):
        assert rows[(form, "optimized")]["fused"] == {
            "CUSTOM:fusekit_attention": 4,
            "CUSTOM:fusekit_layer_norm": 9,
        }
        assert all(ms > 0 for ms in rows[(form, "optimized")]["median_ms"].values())
    error = {key: r["max_abs_error"] for key, r in rows.items()}
    assert error[("float32", "optimized")] < 1e-4
    assert error[("int8", "optimized")] < error[("int8", "plain")]
    assert error[("fk_int8", "optimized")] < error[("int8", "optimized")]


def test_quantization_budget_runs():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "quantization_budget.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("FULLY_CONNECTED weights", "GATHER tables", "both", "dynamic-range model"):
        assert row in proc.stdout


def test_int8_sweep_quick_run(tmp_path):
    """BERT through every quantized form the sweep tries: what converted
    fuses as the float model does."""
    (row,) = run_quick("int8_sweep.py", tmp_path, "int8_sweep.json", "int8_sweep.md")
    forms = row["forms"]
    assert forms["float"]["fused"]
    for name in ("int8", "aeq_int8"):
        assert forms[name]["fused"] == forms["float"]["fused"], name


def test_attention_speed_benchmark_quick_run(tmp_path):
    payload = run_quick(
        "bench_attention_speed.py", tmp_path, "attention_speed.json", "attention_speed.md"
    )
    threads = payload["settings"]["threads"]
    assert payload["results"]
    for r in payload["results"]:
        where = r["case"]["label"]
        for key in [f"{m}@{t}" for m in ("fused", "unfused") for t in threads]:
            assert r["medians_us"].get(key, 0) > 0, f"{where}: no {key}"
        assert r["max_abs_diff"] < 1e-4, f"{where}: fused and unfused differ"
    assert "| ViT-S S197 H6 D64 |" in (tmp_path / "attention_speed.md").read_text()


def test_user_kernels_benchmark_quick_run(tmp_path):
    """bench_user_kernels.py --quick: each case fused into the user's kernel
    and agreeing with its unfused form."""
    rows = run_quick("bench_user_kernels.py", tmp_path, "user_kernels.json")
    assert [r["case"] for r in rows] == [
        "my_custom_fused_op alone",
        "gelu_mul alone",
        "gelu_mul in a GeGLU FFN",
    ]
    for row in rows:
        assert not any(k.startswith("CUSTOM") for k in row["unfused_ops"]), row
        assert any(k.startswith("CUSTOM") for k in row["fused_ops"]), row
        assert row["max_abs_diff"] < 1e-4, row


# One zoo model per kind of exporter (litert_torch.convert of timm, of
# transformers and of diffusers, export_hf's two signatures):
# tests/passes/test_zoo.py holds what fusekit fuses in every zoo model; this
# run checks the table's rows and the attention share.
ZOO_QUICK = ("timm_vit", "hf_bart", "diffusers_unet", "export_hf_default")


def test_zoo_benchmark_quick_run(tmp_path):
    """bench_zoo.py --quick --only ...: each model in the table, counted,
    compared with its plain model and timed at its fixture size."""
    payload = run_quick("bench_zoo.py", tmp_path, "zoo.json", "zoo.md", args=("--only", *ZOO_QUICK))
    zoo = json.loads((ROOT / "tests" / "data" / "torch" / "zoo" / "manifest.json").read_text())
    # Every one asked for (the manifest names them all), in the manifest's order.
    in_order = [e["name"] for e in zoo["models"] if e["name"] in ZOO_QUICK]
    assert len(in_order) == len(ZOO_QUICK)
    assert [r["model"] for r in payload["results"]] == in_order
    markdown = (tmp_path / "zoo.md").read_text()
    for r in payload["results"]:
        assert f"| {r['model']} |" in markdown
        assert r["timings"] and all(t["plain_us"] > 0 and t["fused_us"] > 0 for t in r["timings"])
        # The attention share: the regions the attention fusion rewrites are
        # cut out and timed (not composites an exporter marked).
        if r["model"] in ("timm_vit", "hf_bart", "diffusers_unet"):
            assert sum(t["attention_regions"] for t in r["timings"]) >= 1, r["model"]
        assert all(t["attention_share"] > 0 for t in r["timings"] if t["attention_regions"])


@pytest.mark.skipif(
    not (ROOT / ".venv-torch" / "bin" / "python").exists(),
    reason="the peers' model is exported with litert-torch (scripts/setup_torch.sh)",
)
def test_llm_peers_benchmark_quick_run(tmp_path):
    """bench_llm_peers.py --quick: the tiny Llama exported in every weight
    form, plain LiteRT and fusekit timed on each (and the peers set up
    here), the correctness checks passed, the bar's table written."""
    payload = run_quick(
        "bench_llm_peers.py", tmp_path, "llm_peers.json", "llm_peers.md",
        args=("--models", str(tmp_path / "models"), "--threads", "1"),
    )  # fmt: skip
    timed = {(r["contender"], r["weights"]) for r in payload["rows"]}
    for who in ("LiteRT (plain)", "fusekit"):
        assert {(who, f) for f in ("f32", "int8", "int4 b32")} <= timed
    assert all(r["decode_ms"] > 0 and r["prefill_ms"] > 0 for r in payload["rows"])
    assert [c["weights"] for c in payload["checks"]] == ["f32", "int8", "int4 b32"]
    assert all(c["ok"] for c in payload["checks"]), payload["checks"]
    assert "## The bar (1 thread)" in (tmp_path / "llm_peers.md").read_text()


def test_op_times_quick_run():
    """op_times.py on the Swin fixture, fused: every op kind of the fused
    model timed, the whole model beside the sum."""
    model = ROOT / "tests" / "data" / "torch" / "zoo" / "timm_swin.tflite"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "op_times.py"), str(model), "--fuse"]
        + ["--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"CUSTOM:fusekit_attention", "CUSTOM:fusekit_layer_norm"} <= set(result["kinds"])
    assert result["whole_us"] > 0 and result["ops_sum_us"] > 0
    assert sum(v["count"] for v in result["kinds"].values()) == len(result["slowest"])


def test_bench_patch_embedding(tmp_path):
    """bench_patch_embedding.py --quick: patch convolutions rewritten by
    space_to_depth's auto mode, timed against the original, outputs equal."""
    payload = run_quick(
        "bench_patch_embedding.py", tmp_path, "patch_embedding.json", "patch_embedding.md"
    )
    assert [row["patch"] for row in payload["patches"]] == [4, 6]
    for row in payload["patches"]:
        assert row["original_us"] > 0 and row["rewritten_us"] > 0
        assert row["max_diff"] <= 1e-4
