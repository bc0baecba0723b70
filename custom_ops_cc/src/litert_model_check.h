// What a model must satisfy before LiteRT's CompiledModel may compile it
// with custom-op kernels, beyond being a valid .tflite.
#ifndef FUSEKIT_SRC_LITERT_MODEL_CHECK_H_
#define FUSEKIT_SRC_LITERT_MODEL_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace fusekit {

// Empty when LiteRT's CompiledModel can run the model's custom ops; else why
// not, naming the op, the node (subgraph and operator index) and the input.
// Reads the flatbuffer through a verifier, so a truncated or corrupt buffer
// is reported, never read out of bounds.
std::string CheckModelForLiteRt(const uint8_t* data, size_t size);

}  // namespace fusekit

#endif  // FUSEKIT_SRC_LITERT_MODEL_CHECK_H_
