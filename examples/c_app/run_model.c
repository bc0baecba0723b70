/* Runs a fused .tflite through LiteRT's CompiledModel C API with fusekit's
 * kernels, fills every input of a signature with a fixed ramp and prints
 * every output value.
 *
 *   run_model MODEL.tflite [NUM_THREADS [SIGNATURE...]]
 *
 * With signature keys it runs those signatures in the order given (a key
 * may repeat: prefill, decode, decode) and prints each output as KEY/NAME;
 * without, the first signature.
 *
 * The model's weights must sit at 64-byte aligned offsets (LiteRT refuses
 * unaligned custom-op inputs): write it with fusekit.run.aligned_model.
 * fusekit_litert_add_model_kernels refuses, with the op and input named,
 * what LiteRT would crash on, and gives every fused node its own kernel (the
 * app compiles the handle's copy of the model).
 * Dynamic dims run at the model's default shape (1 where unknown). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusekit/litert.h"

#define CHECK(call)                                                      \
  do {                                                                   \
    LiteRtStatus status_ = (call);                                       \
    if (status_ != kLiteRtStatusOk) {                                    \
      fprintf(stderr, "%s failed with status %d\n", #call, status_);     \
      return 1;                                                          \
    }                                                                    \
  } while (0)

static size_t element_count(const LiteRtLayout* layout) {
  size_t n = 1;
  for (unsigned i = 0; i < layout->rank; ++i) n *= (size_t)layout->dimensions[i];
  return n;
}

static int read_file(const char* path, void** data, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  /* LiteRT reads the model in place; 64-byte alignment keeps the weights
   * aligned in memory as they are in the file. */
  *data = aligned_alloc(64, ((size_t)n + 63) / 64 * 64);
  *size = (size_t)n;
  size_t got = *data ? fread(*data, 1, (size_t)n, f) : 0;
  fclose(f);
  return got == (size_t)n ? 0 : -1;
}

/* Runs signature `index` on ramp inputs and prints its outputs (names
 * prefixed with the signature key when `prefixed`); 0 on success. */
static int run_signature(LiteRtEnvironment env, LiteRtModel model, LiteRtCompiledModel compiled,
                         FusekitLiteRt* fusekit, LiteRtParamIndex index, int prefixed) {
  LiteRtSignature signature;
  LiteRtParamIndex n_in, n_out;
  CHECK(LiteRtGetModelSignature(model, index, &signature));
  const char* key;
  CHECK(LiteRtGetSignatureKey(signature, &key));
  CHECK(LiteRtGetNumSignatureInputs(signature, &n_in));
  CHECK(LiteRtGetNumSignatureOutputs(signature, &n_out));
  LiteRtTensorBuffer* inputs = calloc(n_in, sizeof(LiteRtTensorBuffer));
  LiteRtTensorBuffer* outputs = calloc(n_out, sizeof(LiteRtTensorBuffer));
  /* Shapes as compiled (a signature tensor's own type may have -1 dims);
   * asking for the output layouts also prepares every node, so a node
   * fusekit refuses is reported here rather than at the run. */
  LiteRtLayout* out_layouts = calloc(n_out, sizeof(LiteRtLayout));
  LiteRtStatus prepared =
      LiteRtGetCompiledModelOutputTensorLayouts(compiled, index, n_out, out_layouts, true);
  if (fusekit_litert_last_error(fusekit) != NULL || prepared != kLiteRtStatusOk) {
    fprintf(stderr, "preparing failed: %s\n",
            fusekit_litert_last_error(fusekit) ? fusekit_litert_last_error(fusekit)
                                               : "LiteRT error");
    return 1;
  }

  for (LiteRtParamIndex i = 0; i < n_in + n_out; ++i) {
    const int is_in = i < n_in;
    const LiteRtParamIndex k = is_in ? i : i - n_in;
    LiteRtTensor tensor;
    LiteRtRankedTensorType type;
    if (is_in) {
      CHECK(LiteRtGetSignatureInputTensorByIndex(signature, k, &tensor));
    } else {
      CHECK(LiteRtGetSignatureOutputTensorByIndex(signature, k, &tensor));
    }
    CHECK(LiteRtGetRankedTensorType(tensor, &type));
    if (is_in) {
      CHECK(LiteRtGetCompiledModelInputTensorLayout(compiled, index, k, &type.layout));
    } else {
      type.layout = out_layouts[k];
    }
    /* float32 (1) everywhere; int32 (2) inputs too (token ids, positions). */
    if (type.element_type != 1 && !(is_in && type.element_type == 2)) {
      fprintf(stderr, "this example feeds float32 and int32 and prints float32 tensors only\n");
      return 1;
    }
    const size_t n = element_count(&type.layout);
    LiteRtTensorBuffer buffer;
    CHECK(LiteRtCreateManagedTensorBuffer(env, kLiteRtTensorBufferTypeHostMemory, &type,
                                          n * sizeof(float), &buffer));
    if (is_in) {
      void* values;
      CHECK(LiteRtLockTensorBuffer(buffer, &values, kLiteRtTensorBufferLockModeWrite));
      /* The same ramps the test feeds through Python. */
      for (size_t e = 0; e < n; ++e) {
        if (type.element_type == 2) {
          ((int32_t*)values)[e] = (int32_t)(e % 5);
        } else {
          ((float*)values)[e] = (float)((int)(e % 23) - 11) / 7.0f;
        }
      }
      CHECK(LiteRtUnlockTensorBuffer(buffer));
      inputs[k] = buffer;
    } else {
      outputs[k] = buffer;
    }
  }

  LiteRtStatus ran = LiteRtRunCompiledModel(compiled, index, n_in, inputs, n_out, outputs);
  /* LiteRT ignores a custom-op kernel's status: ask fusekit whether its
   * nodes ran. */
  if (fusekit_litert_last_error(fusekit) != NULL || ran != kLiteRtStatusOk) {
    fprintf(stderr, "run failed: %s\n",
            fusekit_litert_last_error(fusekit) ? fusekit_litert_last_error(fusekit)
                                               : "LiteRT error");
    return 1;
  }

  for (LiteRtParamIndex k = 0; k < n_out; ++k) {
    const char* name;
    LiteRtRankedTensorType type;
    float* values;
    CHECK(LiteRtGetSignatureOutputName(signature, k, &name));
    CHECK(LiteRtGetTensorBufferTensorType(outputs[k], &type));
    CHECK(LiteRtLockTensorBuffer(outputs[k], (void**)&values, kLiteRtTensorBufferLockModeRead));
    const size_t n = element_count(&type.layout);
    if (prefixed) printf("%s/", key);
    printf("%s %zu\n", name, n);
    for (size_t e = 0; e < n; ++e) printf("%.9g\n", values[e]);
    CHECK(LiteRtUnlockTensorBuffer(outputs[k]));
  }

  for (LiteRtParamIndex i = 0; i < n_in; ++i) LiteRtDestroyTensorBuffer(inputs[i]);
  for (LiteRtParamIndex i = 0; i < n_out; ++i) LiteRtDestroyTensorBuffer(outputs[i]);
  free(inputs);
  free(outputs);
  free(out_layouts);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.tflite [NUM_THREADS [SIGNATURE...]]\n", argv[0]);
    return 2;
  }
  const int threads = argc > 2 ? atoi(argv[2]) : 1;
  void* data;
  size_t size;
  if (read_file(argv[1], &data, &size) != 0) {
    fprintf(stderr, "cannot read %s\n", argv[1]);
    return 1;
  }

  LiteRtEnvironment env;
  LiteRtModel model;
  LiteRtOptions options;
  LiteRtCompiledModel compiled;
  CHECK(LiteRtCreateEnvironment(0, NULL, &env));
  CHECK(LiteRtCreateOptions(&options));
  CHECK(LiteRtSetOptionsHardwareAccelerators(options, kLiteRtHwAcceleratorCpu));

  /* Checks the model, registers one kernel per fused node and makes the
   * copy of the model (each such node with its own custom code) that
   * LiteRT must compile. */
  FusekitLiteRt* fusekit = fusekit_litert_add_model_kernels(options, data, size, threads);
  if (fusekit == NULL) {
    fprintf(stderr, "fusekit: %s\n", fusekit_litert_last_error(NULL));
    return 1;
  }
  CHECK(LiteRtCreateModelFromBuffer(env, fusekit_litert_model_data(fusekit),
                                    fusekit_litert_model_size(fusekit), &model));
  LiteRtStatus created = LiteRtCreateCompiledModel(env, model, options, &compiled);
  if (fusekit_litert_last_error(fusekit) != NULL || created != kLiteRtStatusOk) {
    fprintf(stderr, "compiling failed: %s\n",
            fusekit_litert_last_error(fusekit) ? fusekit_litert_last_error(fusekit)
                                               : "LiteRT error");
    return 1;
  }

  if (argc <= 3) {
    if (run_signature(env, model, compiled, fusekit, 0, 0) != 0) return 1;
  }
  for (int arg = 3; arg < argc; ++arg) {
    LiteRtParamIndex count, index;
    CHECK(LiteRtGetNumModelSignatures(model, &count));
    for (index = 0; index < count; ++index) {
      LiteRtSignature signature;
      const char* key;
      CHECK(LiteRtGetModelSignature(model, index, &signature));
      CHECK(LiteRtGetSignatureKey(signature, &key));
      if (strcmp(key, argv[arg]) == 0) break;
    }
    if (index == count) {
      fprintf(stderr, "the model has no signature %s\n", argv[arg]);
      return 1;
    }
    if (run_signature(env, model, compiled, fusekit, index, 1) != 0) return 1;
  }

  LiteRtDestroyCompiledModel(compiled);
  LiteRtDestroyModel(model);  /* before the handle: it owns the model's bytes */
  LiteRtDestroyOptions(options);
  fusekit_litert_release(fusekit);
  LiteRtDestroyEnvironment(env);
  free(data);
  return 0;
}
