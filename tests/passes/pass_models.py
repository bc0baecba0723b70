"""Models for the pass tests: hand-built .tflite graphs (schema object API,
shapes inferred by evaluating each op with numpy while building), models
converted by the plain TF converter, and running a model on ai-edge-litert."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

OP = schema.BuiltinOperator
OPT = schema.BuiltinOptions


def run(model: bytes, inputs: Sequence[np.ndarray], num_threads: int = 1) -> list[np.ndarray]:
    """Outputs of one invoke on ai-edge-litert (XNNPACK on), in output order."""
    interp = Interpreter(model_content=model, num_threads=num_threads)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), inputs, strict=True):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def random_inputs(model: bytes, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    interp = Interpreter(model_content=model)
    out = []
    for d in interp.get_input_details():
        if np.issubdtype(d["dtype"], np.floating):
            out.append(rng.standard_normal(d["shape"]).astype(d["dtype"]))
        else:
            info = np.iinfo(d["dtype"])
            out.append(rng.integers(info.min, info.max, d["shape"]).astype(d["dtype"]))
    return out


def op_names(model: bytes) -> list[str]:
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    names = {v: k for k, v in vars(OP).items() if not k.startswith("_")}
    return [
        names[
            max(
                m.operatorCodes[op.opcodeIndex].builtinCode,
                m.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode,
            )
        ]
        for op in m.subgraphs[0].operators
    ]


def count(model: bytes, name: str) -> int:
    return op_names(model).count(name)


class Builder:
    """A float32 (or int8) .tflite built op by op; each op's output value is
    computed with numpy from example inputs, which gives its shape."""

    def __init__(self) -> None:
        self.tensors: list[schema.TensorT] = []
        self.buffers: list[schema.BufferT] = [schema.BufferT()]
        self.ops: list[schema.OperatorT] = []
        self.codes: list[int] = []
        self.inputs: list[int] = []
        self.values: dict[int, np.ndarray] = {}
        self.rng = np.random.default_rng(0)

    def _tensor(self, value: np.ndarray, name: str, buffer: int = 0, quant=None) -> int:
        t = schema.TensorT()
        t.shape = np.array(value.shape, np.int32)
        t.type = {np.float32: 0, np.int32: 2, np.int8: 9, np.int64: 4, np.bool_: 6}[
            value.dtype.type
        ]
        t.name = name.encode()
        t.buffer = buffer
        t.quantization = quant
        self.tensors.append(t)
        self.values[len(self.tensors) - 1] = value
        return len(self.tensors) - 1

    def input(self, shape: Sequence[int], dtype=np.float32) -> int:
        value = self.rng.standard_normal(shape).astype(dtype)
        index = self._tensor(value, f"input{len(self.inputs)}")
        self.inputs.append(index)
        return index

    def const(self, value, dtype=None, quant=None) -> int:
        value = np.asarray(value, dtype)
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(value.tobytes(), np.uint8).copy()
        self.buffers.append(buffer)
        return self._tensor(value, f"const{len(self.buffers)}", len(self.buffers) - 1, quant)

    def op(
        self,
        code: int,
        inputs: Sequence[int],
        compute: Callable[..., np.ndarray | list[np.ndarray]],
        options_type: int = 0,
        options=None,
        quant=None,
    ) -> int | list[int]:
        values = compute(*[self.values[i] for i in inputs])
        many = isinstance(values, list)
        outs = [
            self._tensor(np.asarray(v), f"t{len(self.tensors)}", quant=quant)
            for v in (values if many else [values])
        ]
        if code not in self.codes:
            self.codes.append(code)
        op = schema.OperatorT()
        op.opcodeIndex = self.codes.index(code)
        op.inputs = np.array(inputs, np.int32)
        op.outputs = np.array(outs, np.int32)
        op.builtinOptionsType = options_type
        op.builtinOptions = options
        self.ops.append(op)
        return outs if many else outs[0]

    # -- ops ---------------------------------------------------------------
    def transpose(self, x: int, perm: Sequence[int]) -> int:
        return self.op(
            OP.TRANSPOSE,
            [x, self.const(np.array(perm, np.int32))],
            lambda v, p: np.transpose(v, p),
            OPT.TransposeOptions,
            schema.TransposeOptionsT(),
        )

    def unary(self, code: int, x: int) -> int:
        fn = {
            OP.RELU: lambda v: np.maximum(v, 0),
            OP.TANH: np.tanh,
            OP.ABS: np.abs,
            OP.NEG: np.negative,
            OP.LOGISTIC: lambda v: 1 / (1 + np.exp(-v)),
        }[code]
        return self.op(code, [x], fn)

    def binary(self, code: int, a: int, b: int) -> int:
        fn, options_type, options = {
            OP.ADD: (np.add, OPT.AddOptions, schema.AddOptionsT()),
            OP.MUL: (np.multiply, OPT.MulOptions, schema.MulOptionsT()),
            OP.SUB: (np.subtract, OPT.SubOptions, schema.SubOptionsT()),
            OP.MAXIMUM: (np.maximum, OPT.MaximumMinimumOptions, schema.MaximumMinimumOptionsT()),
        }[code]
        return self.op(code, [a, b], fn, options_type, options)

    def concat(self, xs: Sequence[int], axis: int) -> int:
        options = schema.ConcatenationOptionsT()
        options.axis = axis
        return self.op(
            OP.CONCATENATION,
            list(xs),
            lambda *v: np.concatenate(v, axis),
            OPT.ConcatenationOptions,
            options,
        )

    def pad(self, x: int, paddings) -> int:
        paddings = np.array(paddings, np.int32)
        return self.op(
            OP.PAD,
            [x, self.const(paddings)],
            lambda v, p: np.pad(v, p),
            OPT.PadOptions,
            schema.PadOptionsT(),
        )

    def reduce(self, code: int, x: int, axes: Sequence[int], keep: bool) -> int:
        fn = {OP.MEAN: np.mean, OP.SUM: np.sum, OP.REDUCE_MAX: np.max}[code]
        options = schema.ReducerOptionsT()
        options.keepDims = keep
        return self.op(
            code,
            [x, self.const(np.array(axes, np.int32))],
            lambda v, a: fn(v, axis=tuple(int(i) for i in a), keepdims=keep).astype(v.dtype),
            OPT.ReducerOptions,
            options,
        )

    def softmax(self, x: int) -> int:
        options = schema.SoftmaxOptionsT()
        options.beta = 1.0

        def fn(v):
            e = np.exp(v - v.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        return self.op(OP.SOFTMAX, [x], fn, OPT.SoftmaxOptions, options)

    def slice(self, x: int, begin, size) -> int:
        def fn(v, b, s):
            return v[tuple(slice(int(i), int(i) + int(n)) for i, n in zip(b, s, strict=True))]

        return self.op(
            OP.SLICE,
            [x, self.const(np.array(begin, np.int32)), self.const(np.array(size, np.int32))],
            fn,
            OPT.SliceOptions,
            schema.SliceOptionsT(),
        )

    def strided_slice(self, x: int, begin, end, strides, begin_mask=0, end_mask=0) -> int:
        options = schema.StridedSliceOptionsT()
        options.beginMask, options.endMask = begin_mask, end_mask

        def fn(v, b, e, s):
            index = []
            for axis, (i, j, k) in enumerate(zip(b, e, s, strict=True)):
                index.append(
                    slice(
                        None if begin_mask >> axis & 1 else int(i),
                        None if end_mask >> axis & 1 else int(j),
                        int(k),
                    )
                )
            return v[tuple(index)]

        consts = [self.const(np.array(a, np.int32)) for a in (begin, end, strides)]
        return self.op(OP.STRIDED_SLICE, [x, *consts], fn, OPT.StridedSliceOptions, options)

    def gather(self, x: int, indices, axis: int) -> int:
        options = schema.GatherOptionsT()
        options.axis = axis
        return self.op(
            OP.GATHER,
            [x, self.const(np.array(indices, np.int32))],
            lambda v, i: np.take(v, i, axis=axis),
            OPT.GatherOptions,
            options,
        )

    def split(self, x: int, axis: int, parts: int) -> list[int]:
        options = schema.SplitOptionsT()
        options.numSplits = parts
        return self.op(
            OP.SPLIT,
            [self.const(np.array(axis, np.int32)), x],
            lambda a, v: list(np.split(v, parts, axis=int(a))),
            OPT.SplitOptions,
            options,
        )

    def reshape(self, x: int, shape: Sequence[int]) -> int:
        options = schema.ReshapeOptionsT()
        options.newShape = list(shape)
        return self.op(
            OP.RESHAPE,
            [x, self.const(np.array(shape, np.int32))],
            lambda v, s: v.reshape([int(d) for d in s]),
            OPT.ReshapeOptions,
            options,
        )

    def conv(self, x: int, out_channels: int, kernel: int = 3, stride: int = 1) -> int:
        """A SAME CONV_2D with random weights (numpy value: zeros of the right
        shape; only shapes matter while building)."""
        cin = self.values[x].shape[-1]
        w = self.const(
            (self.rng.standard_normal((out_channels, kernel, kernel, cin)) * 0.3).astype(np.float32)
        )
        b = self.const(np.zeros(out_channels, np.float32))
        options = schema.Conv2DOptionsT()
        options.padding = schema.Padding.SAME
        options.strideH = options.strideW = stride

        def fn(v, *_):
            n, h, wd, _c = v.shape
            return np.zeros((n, -(-h // stride), -(-wd // stride), out_channels), np.float32)

        return self.op(OP.CONV_2D, [x, w, b], fn, OPT.Conv2DOptions, options)

    def value(self, tensor: int) -> np.ndarray:
        return self.values[tensor]

    def build(self, outputs: Sequence[int]) -> bytes:
        m = schema.ModelT()
        m.version = 3
        m.buffers = self.buffers
        codes = []
        for code in self.codes:
            c = schema.OperatorCodeT()
            c.builtinCode = code
            c.deprecatedBuiltinCode = min(code, 127)
            c.version = 1
            codes.append(c)
        m.operatorCodes = codes
        g = schema.SubGraphT()
        g.tensors = self.tensors
        g.operators = self.ops
        g.inputs = np.array(self.inputs, np.int32)
        g.outputs = np.array(list(outputs), np.int32)
        g.name = b"main"
        m.subgraphs = [g]
        builder = flatbuffers.Builder(1024)
        builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


def channels_first_cnn(
    batch: int = 1, channels: int = 8, size: int = 16, blocks: int = 2, seed: int = 0
):
    """A small CNN written channels-first (tf.transpose around each conv,
    NCHW elementwise ops with [C,1,1] constants, residual adds, a global mean
    over H, W), as a tf.function for the plain converter."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def weights(cin: int, cout: int) -> tf.Tensor:
        scale = np.sqrt(2.0 / (9 * cin))
        return tf.constant((rng.standard_normal((3, 3, cin, cout)) * scale).astype(np.float32))

    w_in = weights(3, channels)
    convs = [(weights(channels, channels), weights(channels, channels)) for _ in range(blocks)]
    biases = [
        tf.constant((rng.standard_normal((channels, 1, 1)) * 0.1).astype(np.float32))
        for _ in range(2 * blocks + 1)
    ]
    scale = tf.constant((rng.random((channels, 1, 1)) + 0.5).astype(np.float32))

    def conv_cf(x, w):
        y = tf.transpose(x, NCHW_TO_NHWC)
        y = tf.nn.conv2d(y, w, 1, "SAME")
        return tf.transpose(y, NHWC_TO_NCHW)

    @tf.function(input_signature=[tf.TensorSpec([batch, 3, size, size], tf.float32)])
    def model(x):
        h = tf.nn.relu(conv_cf(x, w_in) * scale + biases[0])
        for i, (w1, w2) in enumerate(convs):
            r = tf.nn.relu(conv_cf(h, w1) + biases[2 * i + 1])
            h = tf.nn.relu(h + conv_cf(r, w2) + biases[2 * i + 2])
        return tf.reduce_mean(h, axis=[2, 3])

    return model


def convert_tf(function, representative: Callable | None = None, **options) -> bytes:
    """The plain TF converter on a tf.function (int8 with a representative
    dataset: int8 weights per channel, float input and output)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])
    if representative is not None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    for key, value in options.items():
        setattr(converter, key, value)
    return converter.convert()


def representative(shape: Sequence[int], samples: int = 8):
    def data():
        rng = np.random.default_rng(1)
        for _ in range(samples):
            yield [rng.standard_normal(shape).astype(np.float32)]

    return data


def stem(
    size: int = 224,
    channels: int = 3,
    filters: int = 64,
    kernel: int = 7,
    stride: int = 2,
    padding: str = "SAME",
    batch: int = 1,
    depthwise: bool = False,
    seed: int = 0,
):
    """A ResNet-style stem: one strided convolution (+ bias, ReLU), NHWC."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    scale = np.sqrt(2.0 / (kernel * kernel * channels))
    w = tf.constant(
        (rng.standard_normal((kernel, kernel, channels, filters)) * scale).astype(np.float32)
    )
    outputs = filters * channels if depthwise else filters  # depthwise: C * multiplier
    b = tf.constant((rng.standard_normal(outputs) * 0.1).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([batch, size, size, channels], tf.float32)])
    def model(x):
        if depthwise:
            y = tf.nn.depthwise_conv2d(x, w, [1, stride, stride, 1], padding)
        else:
            y = tf.nn.conv2d(x, w, stride, padding)
        return tf.nn.relu(y + b)

    return model
