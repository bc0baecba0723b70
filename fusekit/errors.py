"""Exceptions fusekit raises.  All derive from FusekitError."""

from __future__ import annotations


class FusekitError(Exception):
    """Base class of fusekit's errors."""


class CompositeDefinitionError(FusekitError, ValueError):
    """A composite's name or attrs cannot be expressed in a TFLite model."""


class OpSpecError(FusekitError, ValueError):
    """Attrs or operands an op's spec (declared by its kernel) refuses: an
    unknown or missing attr, a value of the wrong type or out of range, an
    input of the wrong rank; the message names the op."""


class ConversionError(FusekitError):
    """Conversion failed, or (strict mode) a planned composite was not fused."""


class MissingKernelError(FusekitError):
    """A model has custom ops that no loaded fusekit kernel provides."""

    def __init__(self, missing: list[str], available: list[str], model_says: str = ""):
        self.missing = missing
        self.available = available
        #: Where the model's own kernel metadata says the kernels come from
        #: ("" when the model has none).
        self.model_says = model_says
        super().__init__(
            "no kernel for custom op(s) "
            + ", ".join(repr(m) for m in missing)
            + " in the loaded fusekit plugins (they provide: "
            + (", ".join(available) or "nothing")
            + "). "
            + (f"{model_says[0].upper()}{model_says[1:]}. " if model_says else "")
            + "If the kernels are yours, pass their plugin: "
            "fusekit.Interpreter(..., plugins=['path/to/plugin.so']) in Python, "
            "--plugin PATH on the command line (fusekit.build_plugin / `fusekit build` "
            "makes one); else check that the composite's name matches a registered kernel."
        )

    def __reduce__(self) -> tuple:
        return (type(self), (self.missing, self.available, self.model_says))


class RuntimeNotAvailableError(FusekitError, ImportError):
    """The requested TFLite runtime is not installed or lacks a feature."""


class RuntimeTooOldError(RuntimeNotAvailableError):
    """The chosen runtime is older than a builtin op version the model uses
    (it would refuse the model: "Didn't find op for builtin opcode ..."),
    or it would run the model and compute wrong numbers (``computes_wrong``
    says why: tflite-runtime 2.14 returns zeros for hybrid FULLY_CONNECTED,
    BATCH_MATMUL and EMBEDDING_LOOKUP with per-channel int8 weights, and
    garbage for a signature output that is not an output of its subgraph).

    Attributes:
      source: the model's path, or ``"<model_content>"`` for bytes.
      runtime, runtime_version: the runtime chosen, e.g. "tflite-runtime", "2.14.0".
      needed: the TFLite release the model needs, e.g. "2.17.0".
      ops: the op versions the runtime lacks, e.g. ["FULLY_CONNECTED v12"].
      alternatives: runtimes that can load the model, as advice.
      computes_wrong: why the runtime would load the model but compute
        ``ops`` wrong ("" when it would refuse the model).
    """

    def __init__(
        self,
        source: str,
        runtime: str,
        runtime_version: str,
        needed: str,
        ops: list[str],
        alternatives: list[str],
        computes_wrong: str = "",
    ):
        self.source = source
        self.runtime = runtime
        self.runtime_version = runtime_version
        self.needed = needed
        self.ops = ops
        self.alternatives = alternatives
        self.computes_wrong = computes_wrong
        advice = (
            "use " + " or ".join(alternatives) if alternatives else "use a newer TFLite runtime"
        )
        needs = f"TFLite >= {needed}" if needed[:1].isdigit() else needed
        if computes_wrong:
            problem = (
                f"{runtime} {runtime_version} runs {', '.join(ops)} but computes them wrong "
                f"({computes_wrong}); this model needs {needs}"
            )
        else:
            problem = (
                f"this model needs {needs} ({', '.join(ops)}); {runtime} {runtime_version} is older"
            )
        super().__init__(f"{source}: {problem}: {advice}")

    def __reduce__(self) -> tuple:
        return (
            type(self),
            (
                self.source,
                self.runtime,
                self.runtime_version,
                self.needed,
                self.ops,
                self.alternatives,
                self.computes_wrong,
            ),
        )


class InvalidModelError(FusekitError, ValueError):
    """A .tflite model is malformed: its flatbuffer points outside the file,
    or its graph breaks a rule runtimes rely on (tensor indices in range, one
    writer per tensor, ...).  fusekit checks this before any runtime reads
    the model, because some runtimes (tflite-runtime 2.14) do not and crash.

    Attributes:
      source: the model's path, or ``"<model_content>"`` for bytes.
      reason: what is wrong, with the indices of the offending objects.
    """

    def __init__(self, source: str, reason: str):
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: not a valid TFLite model: {reason}")

    def __reduce__(self) -> tuple:
        return (type(self), (self.source, self.reason))


class RuntimeUnsafeModelError(InvalidModelError):
    """A valid model that a runtime crashes on instead of refusing (LiteRT's
    CompiledModel and a custom op with an input left out as -1); fusekit
    refuses it before that runtime reads it.  Interpreters run such models:
    the message says which runtime and why, not that the model is invalid.
    """

    def __init__(self, source: str, reason: str, runtime: str = "LiteRT's CompiledModel"):
        self.runtime = runtime
        super().__init__(source, reason)
        self.args = (f"{source}: a valid model that {runtime} cannot run: {reason}",)

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self) -> tuple:
        return (type(self), (self.source, self.reason, self.runtime))


class PassError(FusekitError, ValueError):
    """A pass cannot run: an unknown pass name, bad pass options, or a model
    the passes cannot work on (the message names the model and what is
    wrong)."""


class PluginBuildError(FusekitError):
    """Compiling or linking a plugin failed; the message holds the compiler's
    diagnostics (file:line: error: ...)."""


class ModelMismatchError(FusekitError, ValueError):
    """Two models compared with ``fusekit.verify`` (or timed with ``fusekit
    bench``) do not take the same inputs or give the same outputs: the
    message names every difference (count, name, dtype, static dims).

    Attributes:
      differences: one line per difference.
    """

    def __init__(self, differences: list[str]):
        self.differences = differences
        super().__init__(
            "the two models' signatures differ, so they cannot run on the same inputs: "
            + "; ".join(differences)
        )

    def __reduce__(self) -> tuple:
        return (type(self), (self.differences,))


class KernelRunError(FusekitError):
    """A fusekit kernel refused a node while LiteRT compiled or ran the model
    (LiteRT itself would not report it: its custom-op dispatcher ignores the
    status a kernel returns)."""


class ResizeRefusedError(FusekitError):
    """fusekit.CompiledModel cannot give a model's input another shape (the
    message says why and what to do instead); nothing was changed."""


class DecodeLoopError(FusekitError, ValueError):
    """A model or a call that :class:`fusekit.DecodeLoop` cannot run exactly."""


class InputShapeError(FusekitError, ValueError, RuntimeError):
    """An input was given a shape its model cannot take (a static dim of its
    shape signature changed, and the runtime could not prepare the model for
    it): the message names the input, its shape signature and the shape given."""
