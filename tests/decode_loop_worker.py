"""fusekit.DecodeLoop on tflite-runtime (runs inside .venv-tflite-runtime).

Usage: python decode_loop_worker.py MODEL.tflite COUNT -- prints JSON: the
greedy tokens of DecodeLoop and of a loop that copies every cache through
set_tensor/get_tensor (on the interpreter's own subgraphs, no resizes: the
signature runner resizes every call, and tflite-runtime 2.14 re-applies
its delegates on a resize), and whether the final caches are bit-equal.
"""

import json
import sys

import numpy as np

import fusekit

PROMPT = [3, 14, 15, 92, 65]
WIDTH = 16


def signature(interp, key):
    runner = interp.get_signature_runner(key)
    ins = {n: int(d["index"]) for n, d in runner.get_input_details().items()}
    outs = {n: int(d["index"]) for n, d in runner.get_output_details().items()}
    return ins, outs, interp._interpreter.GetSubgraphIndexFromSignature(key)


def copying_loop(model, count):
    interp = fusekit.Interpreter(model_content=model, runtime="tflite_runtime", num_threads=1)
    interp.allocate_tensors()
    wrapper = interp._interpreter
    (ins, outs, sub), decode = signature(interp, "prefill_16"), signature(interp, "decode")
    wrapper.AllocateTensors(-1)
    caches = [n for n in ins if n in outs]
    tokens = np.zeros((1, WIDTH), np.int32)
    tokens[0, : len(PROMPT)] = PROMPT
    wrapper.SetTensor(ins["tokens"], tokens, sub)
    wrapper.SetTensor(ins["input_pos"], np.arange(WIDTH, dtype=np.int32), sub)
    for name in caches:
        wrapper.SetTensor(ins[name], np.zeros(wrapper.TensorSize(ins[name], sub), np.float32), sub)
    wrapper.Invoke(sub)
    cache = {n: wrapper.GetTensor(outs[n], sub) for n in caches}
    generated = [int(np.argmax(wrapper.GetTensor(outs["logits"], sub)[0, len(PROMPT) - 1]))]
    ins, outs, sub = decode
    for position in range(len(PROMPT), len(PROMPT) + count - 1):
        wrapper.SetTensor(ins["tokens"], np.array([[generated[-1]]], np.int32), sub)
        wrapper.SetTensor(ins["input_pos"], np.array([position], np.int32), sub)
        for name in caches:
            wrapper.SetTensor(ins[name], cache[name], sub)
        wrapper.Invoke(sub)
        cache = {n: wrapper.GetTensor(outs[n], sub) for n in caches}
        generated.append(int(np.argmax(wrapper.GetTensor(outs["logits"], sub)[0, -1])))
    return generated, cache


def decode_loop(model, count):
    interp = fusekit.Interpreter(model_content=model, runtime="tflite_runtime", num_threads=1)
    loop = fusekit.DecodeLoop(interp, prefill="prefill_16", position_axis=1)
    tokens = np.zeros((1, WIDTH), np.int32)
    tokens[0, : len(PROMPT)] = PROMPT
    out = loop.prefill(tokens=tokens, input_pos=np.arange(WIDTH, dtype=np.int32))
    generated = [int(np.argmax(out["logits"][0, len(PROMPT) - 1]))]
    for position in range(len(PROMPT), len(PROMPT) + count - 1):
        step_inputs = {
            "tokens": np.array([[generated[-1]]], np.int32),
            "input_pos": np.array([position], np.int32),
        }
        out = loop.step(position, **step_inputs)
        generated.append(int(np.argmax(out["logits"][0, -1])))
    return generated, {name: loop.cache(name) for name in loop.caches}


def main():
    with open(sys.argv[1], "rb") as f:
        model = f.read()
    count = int(sys.argv[2])
    want, want_cache = copying_loop(model, count)
    got, got_cache = decode_loop(model, count)
    same = sorted(want_cache) == sorted(got_cache) and all(
        np.array_equal(want_cache[n], got_cache[n]) for n in want_cache
    )
    print(json.dumps({"copying": want, "decode_loop": got, "same_cache": same}))


if __name__ == "__main__":
    main()
