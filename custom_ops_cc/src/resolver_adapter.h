#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fusekit/tflite_abi.h"

namespace fusekit {

// One (name, registration) pair per kernel of this library, ready for
// MutableOpResolver::AddCustom.
std::vector<std::pair<const char*, TfLiteRegistration>> ResolverRegistrations(
    std::string* error);

}  // namespace fusekit
