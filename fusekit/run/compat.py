"""Which TFLite runtimes can load a model: the builtin op versions it uses
against the TFLite release each runtime corresponds to.

A runtime refuses, when it constructs the interpreter, any builtin operator
version its kernel registry does not list ("Didn't find op for builtin
opcode 'FULLY_CONNECTED' version '12'").  Newer converters write newer op
versions (TF 2.21 writes FULLY_CONNECTED v12 for dynamic-range Dense
layers), and tflite-runtime stopped at 2.14, so fusekit names the op and the
runtimes that can load the model before the runtime's own, vaguer, error.

The TFLite release of each runtime:

* tf.lite: the TensorFlow version;
* tflite-runtime: its own version (2.14.0 is its last release);
* ai-edge-litert 2.3: every op version in the table below (it registers
  all of them, checked by behaviour), i.e. at least the op set of TFLite
  2.23.  Older ai-edge-litert releases were not checked: fusekit cannot tell.

No TensorFlow here: this runs on devices.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fusekit.errors import RuntimeTooOldError
from fusekit.model import tflite_schema
from fusekit.model.model_check import ModelBuffer, mapped_model
from fusekit.run import abi_versions

# For each builtin op whose versions grew after TFLite 2.14: the highest
# version TFLite 2.14 (and so tflite-runtime 2.14) registers, then the first
# TFLite release that runs each later version, in version order.  Facts from
# the converter's op-version -> runtime-version table
# (tflite/converter/tools/versioning/runtime_version.cc in google-ai-edge/LiteRT,
# v2.2.0, August 2026).  Checked by behaviour (tests/test_runtime_compat.py):
# tflite-runtime 2.14 accepts every version up to the first number and
# refuses the next; ai-edge-litert 2.3 accepts every version listed except
# STABLEHLO_CBRT (no kernel anywhere); TF 2.21 accepts the versions dated
# 2.21.0 or earlier except QUANTIZE v5 and v6.
NEWER_THAN_2_14: dict[str, tuple[int, tuple[str, ...]]] = {
    "ADD": (5, ("2.23.0",)),
    "BROADCAST_TO": (3, ("2.23.0",)),
    "CAST": (5, ("2.15.0", "2.17.0", "2.21.0", "2.23.0")),
    "CONCATENATION": (4, ("2.21.0", "2.23.0", "2.23.0")),
    "CONV_2D": (7, ("2.15.0",)),
    "COS": (1, ("2.23.0",)),
    "DEQUANTIZE": (5, ("2.18.0", "2.21.0", "2.22.0", "2.23.0")),
    "DILATE": (0, ("2.15.0",)),
    "DYNAMIC_UPDATE_SLICE": (1, ("2.17.0", "2.19.0", "2.20.0", "2.21.0", "2.22.0")),
    "EMBEDDING_LOOKUP": (3, ("2.18.0", "2.21.0")),
    "EQUAL": (4, ("2.21.0",)),
    "FILL": (4, ("2.23.0",)),
    "FULLY_CONNECTED": (10, ("2.15.0", "2.17.0", "2.18.0", "2.21.0")),
    "GATHER": (6, ("2.15.0", "2.23.0")),
    "GATHER_ND": (4, ("2.16.0", "2.23.0")),
    "GELU": (2, ("2.23.0",)),
    "LOG": (1, ("2.15.0",)),
    "MUL": (7, ("2.23.0",)),
    "NOT_EQUAL": (3, ("2.21.0",)),
    "PACK": (4, ("2.23.0",)),
    "PAD": (4, ("2.20.0", "2.23.0")),
    "PADV2": (4, ("2.20.0", "2.23.0")),
    "QUANTIZE": (3, ("2.21.0", "2.21.0", "2.21.0")),
    "REDUCE_WINDOW": (0, ("2.15.0",)),
    "REVERSE_V2": (3, ("2.23.0",)),
    "RSQRT": (2, ("2.15.0",)),
    "SIN": (1, ("2.23.0",)),
    "SLICE": (6, ("2.21.0", "2.23.0")),
    "SOFTMAX": (3, ("2.23.0",)),
    "SPLIT": (4, ("2.23.0",)),
    "SPLIT_V": (2, ("2.23.0",)),
    "SQRT": (1, ("2.21.0",)),
    "STABLEHLO_ADD": (0, ("2.16.0",)),
    "STABLEHLO_AND": (0, ("2.17.0",)),
    "STABLEHLO_CASE": (0, ("2.17.0",)),
    "STABLEHLO_CBRT": (0, ("2.17.0",)),
    "STABLEHLO_COMPOSITE": (0, ("2.17.0",)),
    "STABLEHLO_GATHER": (0, ("2.16.0",)),
    "STABLEHLO_MAXIMUM": (0, ("2.16.0",)),
    "STABLEHLO_MINIMUM": (0, ("2.16.0",)),
    "STABLEHLO_MULTIPLY": (0, ("2.16.0",)),
    "STABLEHLO_PAD": (0, ("2.16.0",)),
    "STABLEHLO_REDUCE_WINDOW": (0, ("2.16.0",)),
    "STABLEHLO_RNG_BIT_GENERATOR": (0, ("2.15.0",)),
    "STABLEHLO_SCATTER": (0, ("2.15.0",)),
    "STABLEHLO_SHIFT_LEFT": (0, ("2.17.0",)),
    "TRANSPOSE": (6, ("2.14.4", "2.22.0", "2.23.0")),
    "TRANSPOSE_CONV": (4, ("2.15.0",)),
    "UNPACK": (4, ("2.22.0", "2.23.0")),
}

# Hybrid ops (float activations, constant int8 weights) whose TFLite 2.14
# kernels read a single scale for the weights: given one scale per output
# channel (or per row) they scale every product by 0 and return zeros,
# without an error.  Op -> the input holding the weights.  Checked by
# behaviour (tests/test_runtime_compat.py): tflite-runtime 2.14 returns zeros
# for each; ai-edge-litert 2.3 and tf.lite 2.21 compute them right; CONV_2D
# and DEPTHWISE_CONV_2D with per-channel hybrid weights are right on 2.14,
# and per-tensor weights are right for all.  ai-edge-quantizer's dynamic
# int8 recipe writes these per channel at op versions 2.14 registers.
PER_CHANNEL_HYBRID_WRONG_UP_TO_2_14: dict[str, int] = {
    "BATCH_MATMUL": 1,
    "EMBEDDING_LOOKUP": 1,
    "FULLY_CONNECTED": 1,
}
_WEIGHT_TYPES = ("INT8", "INT4")
_NEWER_THAN_2_14 = "a TFLite release newer than 2.14"

#: The last tflite-runtime release (assumed when it is not installed).
TFLITE_RUNTIME_LAST = "2.14.0"
#: The ai-edge-litert release checked to load every op version above.
LITERT_CHECKED = "2.3.0"
# The release that a runtime loading every version in the table corresponds
# to (the newest release the table names).
_TABLE_RELEASE = "2.23.0"

#: Runtime name -> the name users know it by.
RUNTIME_NAMES = {"litert": "ai-edge-litert", "tf": "tf.lite", "tflite_runtime": "tflite-runtime"}
_METADATA_NAME = b"min_runtime_version"


@dataclass(frozen=True)
class OpVersion:
    """A builtin op version and the first TFLite release that runs it
    (None: TFLite 2.14 or earlier, or not in fusekit's table)."""

    op: str
    version: int
    release: str | None


@dataclass(frozen=True)
class RuntimeSupport:
    """Whether one runtime can load a model.

    ``loads`` is None when fusekit cannot tell (an ai-edge-litert release it
    has not checked); ``too_new`` lists the op versions the runtime lacks.
    """

    runtime: str
    version: str | None
    installed: bool
    loads: bool | None
    too_new: tuple[OpVersion, ...] = ()

    @property
    def label(self) -> str:
        """E.g. "tflite-runtime 2.14.0"."""
        name = RUNTIME_NAMES[self.runtime]
        return f"{name} {self.version}" if self.version else name


def release_tuple(release: str) -> tuple[int, ...]:
    """ "2.17.0" -> (2, 17, 0); a suffix ("2.21.0rc1", "2.4.0.dev1") is
    ignored from its first non-digit on."""
    parts = []
    for part in release.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(parts)


def _newer(a: str, b: str | None) -> bool:
    return b is None or release_tuple(a) > release_tuple(b)


def _buffer_bytes(buf: ModelBuffer, buffer: tflite_schema.Table) -> bytes:
    # Models written with buffer offsets keep the data after the flatbuffer,
    # ``offset`` bytes from the file's start.
    size = buffer.scalar("size")
    if size:
        start = buffer.scalar("offset")
        return bytes(buf[start : start + size])
    return buffer.blob("data") or b""


def min_runtime_version(buf: ModelBuffer) -> str | None:
    """The model's ``min_runtime_version`` metadata (the TFLite release the
    converter says it needs), or None when the model has none.  ``buf`` is a
    model ``model_check.verify_model`` accepted."""
    root = tflite_schema.model(buf)
    for entry in root.items("metadata"):
        if entry.string("name") != _METADATA_NAME:
            continue
        index = entry.scalar("buffer")
        if index >= root.length("buffers"):
            return None
        # The converter pads the string with NULs to a fixed size.
        text = _buffer_bytes(buf, root.item("buffers", index)).split(b"\0", 1)[0]
        return text.decode("ascii", "replace") or None
    return None


def op_version_release(op: str, version: int) -> str | None:
    """The first TFLite release that runs ``op`` at ``version`` when that is
    later than 2.14 (None otherwise, or when fusekit's table does not know
    the version)."""
    if op not in NEWER_THAN_2_14:
        return None
    last_in_2_14, releases = NEWER_THAN_2_14[op]
    index = version - last_in_2_14 - 1
    return releases[index] if 0 <= index < len(releases) else None


def op_versions(buf: ModelBuffer) -> list[OpVersion]:
    """The distinct builtin op versions a verified model uses, sorted."""
    found = set()
    for code in tflite_schema.model(buf).items("operator_codes"):
        builtin = tflite_schema.builtin_code(code)
        if builtin == tflite_schema.CUSTOM:
            continue
        name = tflite_schema.BUILTIN_OPERATORS.get(builtin, str(builtin))
        version = code.scalar("version")
        found.add(OpVersion(name, version, op_version_release(name, version)))
    return sorted(found, key=lambda o: (o.op, o.version))


def per_channel_hybrid_ops(buf: ModelBuffer) -> list[str]:
    """The ops of a verified model that TFLite 2.14 computes wrong: hybrid
    ops of PER_CHANNEL_HYBRID_WRONG_UP_TO_2_14 (a float output) whose
    constant weights carry more than one scale, each as e.g.
    "FULLY_CONNECTED v5 (hybrid, per-channel int8 weights)", sorted."""
    root = tflite_schema.model(buf)
    codes = []
    for code in root.items("operator_codes"):
        name = tflite_schema.BUILTIN_OPERATORS.get(tflite_schema.builtin_code(code))
        codes.append((name, code.scalar("version")))
    if not any(name in PER_CHANNEL_HYBRID_WRONG_UP_TO_2_14 for name, _ in codes):
        return []
    found = set()
    for graph in root.items("subgraphs"):
        tensors = graph.length("tensors")
        for op in graph.items("operators"):
            index = op.scalar("opcode_index")
            if index >= len(codes) or codes[index][0] not in PER_CHANNEL_HYBRID_WRONG_UP_TO_2_14:
                continue
            name, version = codes[index]
            inputs, outputs = op.values("inputs"), op.values("outputs")
            slot = PER_CHANNEL_HYBRID_WRONG_UP_TO_2_14[name]
            if len(inputs) <= slot or not outputs:
                continue
            weights, out = inputs[slot], outputs[0]
            if not (0 <= weights < tensors and 0 <= out < tensors):
                continue
            w = graph.item("tensors", weights)
            dtype = tflite_schema.TENSOR_TYPES.get(w.scalar("type"))
            if dtype not in _WEIGHT_TYPES:
                continue
            if (
                tflite_schema.TENSOR_TYPES.get(graph.item("tensors", out).scalar("type"))
                != "FLOAT32"
            ):
                continue  # integer activations: not hybrid
            quant = w.table("quantization")
            if quant is not None and quant.length("scale") > 1:
                found.add(f"{name} v{version} (hybrid, per-channel {dtype.lower()} weights)")
    return sorted(found)


def unlisted_signature_outputs(buf: ModelBuffer) -> list[str]:
    """Signature outputs of a verified model that name a tensor its subgraph
    does not list as an output (ai-edge-quantizer's static recipes leave
    such signatures).  TFLite 2.14 plans that tensor's memory as a temporary
    and reuses it, so its signature runner returns garbage there (checked by
    behaviour, tests/test_runtime_compat.py).  Each as e.g. "signature
    'decode' output 'kv_cache_k_0' (tensor 72)"."""
    root = tflite_schema.model(buf)
    found = []
    for sig in root.items("signature_defs"):
        index = sig.scalar("subgraph_index")
        if index >= root.length("subgraphs"):
            continue
        graph = root.item("subgraphs", index)
        listed = set(graph.values("outputs")) | set(graph.values("inputs"))
        key = (sig.string("signature_key") or b"").decode("utf-8", "replace")
        for out in sig.items("outputs"):
            tensor = out.scalar("tensor_index")
            if tensor not in listed:
                name = (out.string("name") or b"").decode("utf-8", "replace")
                found.append(f"signature {key!r} output {name!r} (tensor {tensor})")
    return found


def _too_new(ops: list[OpVersion], release: str) -> tuple[OpVersion, ...]:
    bad = []
    for op in ops:
        if op.release is not None:
            if _newer(op.release, release):
                bad.append(op)
        elif op.op in NEWER_THAN_2_14 and not _newer(release, "2.14.0"):
            # A version newer than any the table knows: certainly newer than
            # what 2.14 registers.
            if op.version > NEWER_THAN_2_14[op.op][0]:
                bad.append(op)
    return tuple(bad)


def support(ops: list[OpVersion], runtime: str, version: str | None = None) -> RuntimeSupport:
    """Whether ``runtime`` at ``version`` (default: the installed one, else
    the newest fusekit knows) can load a model using ``ops``."""
    installed = abi_versions.runtime_version(runtime)
    if version is None:
        version = installed or {
            "tflite_runtime": TFLITE_RUNTIME_LAST,
            "litert": LITERT_CHECKED,
        }.get(runtime)
    is_installed = installed is not None and installed == version
    if version is None:
        return RuntimeSupport(runtime, None, False, None)
    if runtime == "litert":
        if release_tuple(version) < release_tuple(LITERT_CHECKED):
            return RuntimeSupport(runtime, version, is_installed, None)
        release = _TABLE_RELEASE
    else:
        release = version
    too_new = _too_new(ops, release)
    return RuntimeSupport(runtime, version, is_installed, not too_new, too_new)


def runtime_support(buf: ModelBuffer) -> list[RuntimeSupport]:
    """Whether each of the three runtimes can load a verified model: the
    installed release of each, or the newest fusekit knows of the ones not
    installed (tflite-runtime 2.14.0, ai-edge-litert 2.3.0)."""
    ops = op_versions(buf)
    return [support(ops, runtime) for runtime in ("litert", "tf", "tflite_runtime")]


def _needed(too_new: tuple[OpVersion, ...]) -> str:
    known = [op.release for op in too_new if op.release]
    return max(known, key=release_tuple) if known else "a release newer than 2.14"


def _alternatives(ops: list[OpVersion], runtime: str, needed: str) -> list[str]:
    """The other runtimes that can load the model, as advice."""
    others = []
    for other in ("litert", "tf", "tflite_runtime"):
        if other == runtime:
            continue
        if other == "litert" and support(ops, other, LITERT_CHECKED).loads:
            others.append(f"ai-edge-litert (>= {LITERT_CHECKED})")
        elif other == "tf" and needed[0].isdigit():
            others.append(f"tf.lite (TensorFlow >= {needed})")
        elif other == "tflite_runtime" and support(ops, other, TFLITE_RUNTIME_LAST).loads:
            others.append("tflite-runtime")
    return others


def check_loadable(model: ModelBuffer | str | os.PathLike[str], runtime: str) -> None:
    """Raises RuntimeTooOldError when the installed ``runtime`` lacks a
    builtin op version the model uses (``model``: verified bytes, or a path).

    Silent when fusekit cannot tell (an ai-edge-litert release older than
    the one checked, a TensorFlow whose version is unknown).  A tflite-runtime
    without version metadata is taken as 2.14.0, its last release.
    """
    with _opened(model) as buf:
        ops = op_versions(buf)
        declared = min_runtime_version(buf)
        version = abi_versions.runtime_version(runtime)
        if runtime == "tflite_runtime":
            version = version or TFLITE_RUNTIME_LAST
        up_to_2_14 = runtime != "litert" and bool(version) and not _newer(version, "2.14.99")
        hybrid = per_channel_hybrid_ops(buf) if up_to_2_14 else []
        unlisted = unlisted_signature_outputs(buf) if up_to_2_14 else []
    source = "<model_content>" if not isinstance(model, (str, os.PathLike)) else str(model)
    result = support(ops, runtime, abi_versions.runtime_version(runtime))
    if result.loads is False:  # it would not load the model at all
        needed = _needed(result.too_new)
        if declared and _newer(declared, needed) and needed[0].isdigit():
            needed = declared
        raise RuntimeTooOldError(
            source=source,
            runtime=RUNTIME_NAMES[runtime],
            runtime_version=result.version or "?",
            needed=needed,
            ops=[f"{op.op} v{op.version}" for op in result.too_new],
            alternatives=_alternatives(ops, runtime, needed),
        )
    for wrong, why in (
        (hybrid, "its kernels read one weight scale and return zeros"),
        (unlisted, "it reuses the memory of a signature output its subgraph does not list"),
    ):
        if wrong:
            raise RuntimeTooOldError(
                source=source,
                runtime=RUNTIME_NAMES[runtime],
                runtime_version=version or "?",
                needed=_NEWER_THAN_2_14,
                ops=wrong,
                alternatives=[
                    f"ai-edge-litert (>= {LITERT_CHECKED})",
                    "tf.lite (TensorFlow >= 2.21)",
                ],
                computes_wrong=why,
            )


@contextlib.contextmanager
def _opened(model: ModelBuffer | str | os.PathLike[str]) -> Iterator[ModelBuffer]:
    """The bytes of a model given as bytes or as a path (mapped, not read)."""
    if isinstance(model, (str, os.PathLike)):
        with mapped_model(Path(model)) as mapped:
            yield mapped
    else:
        yield model


__all__ = [
    "NEWER_THAN_2_14",
    "PER_CHANNEL_HYBRID_WRONG_UP_TO_2_14",
    "LITERT_CHECKED",
    "OpVersion",
    "RUNTIME_NAMES",
    "RuntimeSupport",
    "TFLITE_RUNTIME_LAST",
    "check_loadable",
    "min_runtime_version",
    "op_version_release",
    "op_versions",
    "per_channel_hybrid_ops",
    "unlisted_signature_outputs",
    "release_tuple",
    "runtime_support",
    "support",
]
