"""int8 calibration that runs fusekit's kernels through the public
interpreter API.

Full-integer quantization runs the float model over the representative
dataset to record each activation's range.  TensorFlow's own calibrator
runs it in TensorFlow's private TFLite copy, which takes custom kernels
only as op-resolver registerers; adding fusekit's kernels there would mean
calling one library's ``MutableOpResolver::AddCustom`` on a resolver another
library built, trusting that their C++ layouts match.  fusekit does not:
for a model with custom ops it takes over the converter's quantize step
(see tf_private.replace_quantize_step):

1. the typed attrs the converter carried as marked strings are restored
   first, so the kernels read their real attrs (lists, bools);
2. the converter's own pre-calibration step (add_intermediate_tensors);
3. the float model runs in ``fusekit.Interpreter`` (fusekit's delegate,
   every tensor preserved) over the dataset, and each tensor TensorFlow's
   calibrator would log gets the same statistic: the running min and max
   over all samples, NaNs ignored, of every float32 input and output of an
   operator that has no constant data;
4. min/max are written into the tensors' quantization fields, as
   TensorFlow's calibration does, and the model goes to the same quantizer
   with the same options the converter would use.

Models without custom ops are calibrated the same way.  TensorFlow 2.21's
calibrator records a FULLY_CONNECTED's output range as that of the
residual ADD reading it when the FULLY_CONNECTED comes from Keras'
EinsumDense (every attention and feed-forward output projection of
keras-hub's transformers): measured on BERT, a range of +-3.8 for values
within +-0.15, so the int8 projection keeps about 10 of its 256 codes.
Reading every tensor after a run with all tensors preserved records the
range each tensor really has.  Builtin-only models that this cannot
calibrate (control flow bodies, variables, 16-bit activations, the legacy
quantizer) keep TensorFlow's own calibration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from fusekit.conversion import tf_private
from fusekit.conversion.typed_attrs_pass import restore_typed_attrs
from fusekit.errors import ConversionError, MissingKernelError
from fusekit.model.flatbuffer_edit import pack_model, read_model
from fusekit.model.model_ops import builtin_code

_FLOAT32 = schema.TensorType.FLOAT32


def use_fusekit_calibration(converter: Any, bool_attrs: dict[str, set[str]]) -> None:
    """Lets int8 calibration of this converter run fusekit's kernels (and
    those of registered user plugins) without TensorFlow's private TFLite.

    ``bool_attrs`` maps an op name to the attrs that were bools in
    TensorFlow (see typed_attrs_pass).  Does nothing without a
    representative dataset (no calibration then).

    Raises:
      ConversionError: this TensorFlow's quantize step is not the one
        fusekit was verified with.
    """
    if getattr(converter, "representative_dataset", None) is None:
        return

    def step(
        model: bytes,
        request: tf_private.QuantizeRequest,
        tf_quantize: Callable[[bytes], bytes],
    ) -> bytes:
        reason = tf_private.legacy_quantizer_reason(request)
        if _custom_op_names(read_model(model)):
            model, _ = restore_typed_attrs(bytes(model), bool_attrs)
            if reason is not None and not request.calibrate_only:
                raise ConversionError(
                    "int8 calibration of a model with custom ops runs fusekit's kernels and "
                    f"hands the calibrated model to TensorFlow's MLIR quantizer, but {reason}; "
                    "use 8-bit activations with the default experimental_new_quantizer=True"
                )
            prepared = tf_private.add_intermediate_tensors(model)
        else:
            prepared = tf_private.add_intermediate_tensors(bytes(model))
            if reason is not None or _uncalibratable(read_model(prepared)) is not None:
                return tf_quantize(model)
        calibrated = calibrate(prepared, request.samples)
        if request.calibrate_only:
            return calibrated
        return tf_private.quantize_calibrated(calibrated, request)

    tf_private.replace_quantize_step(converter, step)


def _custom_op_names(m: schema.ModelT) -> list[str]:
    used = {op.opcodeIndex for sg in m.subgraphs or [] for op in sg.operators or []}
    return sorted(
        m.operatorCodes[i].customCode.decode() for i in used if m.operatorCodes[i].customCode
    )


def _uncalibratable(m: schema.ModelT) -> str | None:
    """Why one read of every tensor after a run cannot calibrate ``m``, or
    None when it can."""
    try:
        _check_calibratable(m)
    except ConversionError as e:
        return str(e)
    return None


def _indices(vector: Any) -> list[int]:
    # The object API gives index vectors as numpy arrays, or None when empty.
    return [] if vector is None else [int(i) for i in vector]


def loggable_tensors(m: schema.ModelT, subgraph_index: int = 0) -> list[int]:
    """The tensors of a subgraph whose range calibration records: float32
    inputs and outputs of operators that have no constant data."""
    subgraph = m.subgraphs[subgraph_index]
    found: set[int] = set()
    for op in subgraph.operators or []:
        for index in _indices(op.inputs) + _indices(op.outputs):
            if index < 0:  # an optional input left out
                continue
            tensor = subgraph.tensors[index]
            buffer = m.buffers[tensor.buffer] if m.buffers else None
            constant = buffer is not None and (
                (buffer.data is not None and len(buffer.data) > 0) or buffer.offset > 1
            )
            if tensor.type == _FLOAT32 and not constant:
                found.add(index)
    return sorted(found)


def _signature_subgraphs(m: schema.ModelT) -> dict[str, int]:
    return {s.signatureKey.decode(): int(s.subgraphIndex) for s in m.signatureDefs or []}


def _check_calibratable(m: schema.ModelT) -> None:
    """Refuses what one read of every tensor after a run cannot record as
    TensorFlow's calibrator does (it logs around each operator call)."""
    count = len(m.subgraphs or [])
    bodies = sorted(set(range(count)) - {0, *_signature_subgraphs(m).values()})
    if bodies:
        raise ConversionError(
            f"int8 calibration with fusekit's kernels cannot record subgraph(s) {bodies}: "
            "they are control flow bodies (run several times per invoke), not signatures"
        )
    for subgraph in m.subgraphs:
        for index, op in enumerate(subgraph.operators or []):
            if op.intermediates is not None and len(op.intermediates):
                code = m.operatorCodes[op.opcodeIndex]
                name = (
                    code.customCode.decode() if code.customCode else f"builtin {builtin_code(code)}"
                )
                raise ConversionError(
                    f"int8 calibration with fusekit's kernels cannot record the intermediate "
                    f"tensors of operator {index} ({name}): they are computed inside its kernel"
                )
        for tensor in subgraph.tensors or []:
            if tensor.isVariable and tensor.type == _FLOAT32:
                raise ConversionError(
                    f"int8 calibration with fusekit's kernels cannot record variable tensor "
                    f"{tensor.name.decode()!r}: its value changes within one run"
                )


class _Runner:
    """Runs one representative sample, in the forms TensorFlow's calibrator
    accepts: a list in the first subgraph's input order, a dict by input
    name (one signature), or (signature key, dict)."""

    def __init__(self, interpreter: Any, m: schema.ModelT):
        self._interpreter = interpreter
        self._inputs = _indices(m.subgraphs[0].inputs)
        self._subgraphs = _signature_subgraphs(m)
        self._shapes: dict[int, tuple[int, ...]] = {}

    def _signature(self, key: str | None) -> str:
        if key is None:
            if len(self._subgraphs) != 1:
                raise ConversionError(
                    "a representative sample given as a dict must name its signature "
                    f"((key, dict)): the model has {sorted(self._subgraphs) or 'none'}"
                )
            return next(iter(self._subgraphs))
        if key not in self._subgraphs:
            raise ConversionError(
                f"representative sample for signature {key!r}: the model's signatures are "
                f"{sorted(self._subgraphs) or 'none'}"
            )
        return key

    def _run_signature(self, key: str | None, inputs: dict[str, Any]) -> int:
        key = self._signature(key)
        runner = self._interpreter.get_signature_runner(key)
        names = sorted(runner.get_input_details())
        if sorted(inputs) != names:
            raise ConversionError(
                f"representative sample for signature {key!r}: the inputs are {names}; got "
                f"{sorted(inputs)}"
            )
        runner(**{name: np.asarray(value) for name, value in inputs.items()})
        return self._subgraphs[key]

    def _run_list(self, sample: list) -> int:
        if len(sample) != len(self._inputs):
            raise ConversionError(
                f"representative sample has {len(sample)} arrays; the model has "
                f"{len(self._inputs)} inputs"
            )
        arrays = [
            (index, np.asarray(value)) for index, value in zip(self._inputs, sample, strict=True)
        ]
        resized = False
        for index, array in arrays:
            if self._shapes.get(index) != array.shape:
                self._interpreter.resize_tensor_input(index, list(array.shape), strict=False)
                self._shapes[index] = array.shape
                resized = True
        if resized:
            self._interpreter.allocate_tensors()
        for index, array in arrays:
            self._interpreter.set_tensor(index, array)
        self._interpreter.invoke()
        return 0

    def run(self, sample: Any) -> int:
        """Runs the sample; returns the index of the subgraph it ran."""
        if isinstance(sample, tuple):
            if len(sample) != 2 or not isinstance(sample[1], dict):
                raise ConversionError(
                    "a representative sample given as a tuple must be (signature key, dict of "
                    "inputs by name)"
                )
            return self._run_signature(sample[0], sample[1])
        if isinstance(sample, dict):
            return self._run_signature(None, sample)
        if isinstance(sample, list):
            return self._run_list(sample)
        raise ConversionError(
            "a representative sample must be a list of input arrays in input order, a dict by "
            f"input name, or (signature key, dict); got {type(sample).__name__}"
        )


class _Range:
    """Running min and max of a subgraph's loggable tensors, NaN ignored."""

    def __init__(self, tensors: list[int]):
        self.tensors = tensors
        self.low = np.full(len(tensors), np.inf, np.float32)
        self.high = np.full(len(tensors), -np.inf, np.float32)
        self.runs = 0

    def update(self, interpreter: Any, subgraph_index: int) -> None:
        self.runs += 1
        for slot, index in enumerate(self.tensors):
            values = interpreter.get_tensor(index, subgraph_index)
            values = values[~np.isnan(values)]
            if values.size:
                self.low[slot] = min(self.low[slot], values.min())
                self.high[slot] = max(self.high[slot], values.max())


def _interpreter(model: bytes) -> Any:
    from ai_edge_litert.interpreter import OpResolverType

    from fusekit.run import plugin
    from fusekit.run.interpreter import Interpreter

    try:
        # TensorFlow's calibrator runs the builtin kernels without the
        # default delegates, and every tensor must keep its value to be read
        # after the run.
        return Interpreter(
            model_content=model,
            runtime="litert",
            plugins=plugin.registered_plugins(),
            experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
    except MissingKernelError as exc:
        raise ConversionError(
            "int8 calibration runs the float model: unresolved custom op(s) "
            f"{', '.join(exc.missing)}: {exc}. If a plugin of yours has the kernel, pass "
            "plugins=[path] to fusekit.convert (--plugin PATH on the command line)"
        ) from exc


def calibrate(model: bytes, samples: Callable[[], Iterable[Any]]) -> bytes:
    """Runs the float model with fusekit's kernels over ``samples()`` and
    returns it with each loggable tensor's running min/max written into its
    quantization fields (what TensorFlow's calibration writes).

    Raises:
      ConversionError: the model cannot be calibrated this way (control
        flow subgraphs, kernels that keep intermediates, variable tensors), a
        kernel is missing, a sample does not fit, or a tensor never had a
        non-NaN value.
    """
    m = read_model(model)
    _check_calibratable(m)
    ranges = [_Range(loggable_tensors(m, i)) for i in range(len(m.subgraphs))]
    interpreter = _interpreter(model)
    runner = _Runner(interpreter, m)
    for sample in samples():
        subgraph_index = runner.run(sample)
        ranges[subgraph_index].update(interpreter, subgraph_index)
    if not any(r.runs for r in ranges):
        raise ConversionError("the representative dataset yielded no samples")

    # As TensorFlow's calibration: a subgraph no sample ran gets no range.
    for subgraph, found in zip(m.subgraphs, ranges, strict=True):
        for slot, index in enumerate(found.tensors if found.runs else []):
            tensor = subgraph.tensors[index]
            if found.low[slot] > found.high[slot]:
                raise ConversionError(
                    f"int8 calibration: tensor {tensor.name.decode()!r} had no real value over "
                    "the representative dataset (only NaN)"
                )
            params = schema.QuantizationParametersT()
            params.min = [float(found.low[slot])]
            params.max = [float(found.high[slot])]
            tensor.quantization = params
    return pack_model(m, model)
