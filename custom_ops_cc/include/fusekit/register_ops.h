// Registration of fusekit's kernels with a TFLite op resolver, for C++ apps:
//
//   tflite::ops::builtin::BuiltinOpResolver resolver;
//   fusekit::RegisterOps(&resolver);
//
// Needs the real TFLite headers and library (see BUILD).
#pragma once

namespace tflite {
class MutableOpResolver;
}  // namespace tflite

namespace fusekit {

// Adds every kernel of this library as a custom op.  False on failure.
bool RegisterOps(tflite::MutableOpResolver* resolver);

}  // namespace fusekit
