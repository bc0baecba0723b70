// Test kernel that reports what it reads through fusekit's ABI declarations:
// for each of its three inputs, 10 numbers
//   rank, dims[0..4] (-1 past the rank), type, bytes, is_constant, name hash
// so a test can compare them with the runtime's own Python API.  The name
// hash is sum(byte * (i + 1)) mod 2^20 over the name's bytes (exact in float).
#include <cstdint>

#include "fusekit/kernel_sdk.h"

namespace {

using fusekit::In;
using fusekit::Out;

constexpr int kFields = 10;

float NameHash(const char* name) {
  uint32_t h = 0;
  for (uint32_t i = 0; name[i] != '\0'; ++i) {
    h = (h + static_cast<uint8_t>(name[i]) * (i + 1)) % (1u << 20);
  }
  return static_cast<float>(h);
}

template <typename T>
void Describe(const In<T>& t, float* out) {
  out[0] = static_cast<float>(t.rank());
  for (int d = 0; d < 5; ++d) out[1 + d] = d < t.rank() ? static_cast<float>(t.dim(d)) : -1.0f;
  out[6] = static_cast<float>(t.type());
  out[7] = static_cast<float>(t.bytes());
  out[8] = t.is_constant() ? 1.0f : 0.0f;
  out[9] = NameHash(t.name());
}

class AbiProbe {
 public:
  AbiProbe(const fusekit::Attrs&, std::string*) {}

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<float> a, In<int32_t> b, In<float> c,
                       Out<float> report) {
    return ctx.ResizeOutput(report, {3, kFields});
  }

  TfLiteStatus Invoke(fusekit::OpContext&, In<float> a, In<int32_t> b, In<float> c,
                      Out<float> report) {
    Describe(a, report.data());
    Describe(b, report.data() + kFields);
    Describe(c, report.data() + 2 * kFields);
    return kTfLiteOk;
  }
};

}  // namespace

FUSEKIT_REGISTER_KERNEL("abi_probe", AbiProbe, fusekit::Inputs("a", "b", "c"),
                        fusekit::Outputs("report"), fusekit::AttrSchema());
