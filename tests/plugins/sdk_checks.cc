// Test kernels for the SDK's own checks: reading an attr the schema does not
// declare, the FUSEKIT_ENSURE_EQ family's messages, and the typed scratch
// layout.
#include <cstdint>
#include <vector>

#include "fusekit/kernel_sdk.h"

namespace {

using fusekit::In;
using fusekit::Out;

// Reads "epsilom" where the schema declares "epsilon": a typo the SDK must
// refuse at node init instead of reading 0.
class TypoAttr {
 public:
  TypoAttr(const fusekit::Attrs& attrs, std::string*)
      : epsilon_(static_cast<float>(attrs.Float("epsilom"))) {}

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<float> x, Out<float> y) {
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(fusekit::OpContext&, In<float> x, Out<float> y) {
    for (int64_t i = 0; i < x.num_elements(); ++i) y.data()[i] = x.data()[i] * epsilon_;
    return kTfLiteOk;
  }

 private:
  float epsilon_;
};

FUSEKIT_REGISTER_KERNEL("sdk_typo", TypoAttr, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema(fusekit::attr::Float("epsilon", 0.5)));

// y = x * scale, with x's last dim equal to `size`, scale > 0 and x not of
// shape [1, 1]: each check a comparison macro.
class Checked {
 public:
  Checked(const fusekit::Attrs& attrs, std::string*)
      : size_(attrs.Int("size")), scale_(attrs.Float("scale")) {}

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<float> x, Out<float> y) {
    FUSEKIT_ENSURE_EQ(ctx, x.rank(), 2);
    FUSEKIT_ENSURE_EQ(ctx, x.dim(-1), size_, "x's last dim against attr '%s'", "size");
    FUSEKIT_ENSURE_GT(ctx, scale_, 0.0);
    FUSEKIT_ENSURE_NE(ctx, x.shape(), std::vector<int>({1, 1}), "x's shape");
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(fusekit::OpContext&, In<float> x, Out<float> y) {
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      y.data()[i] = x.data()[i] * static_cast<float>(scale_);
    }
    return kTfLiteOk;
  }

 private:
  int64_t size_;
  double scale_;
};

FUSEKIT_REGISTER_KERNEL("sdk_checked", Checked, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema(fusekit::attr::Int("size", 3),
                                            fusekit::attr::Float("scale", 1.0)));

// y = 2 * x through a typed scratch: each row goes through the worker's
// float array and a shared double array of `extra` elements; every array
// must be 64-byte aligned and none may overlap another.  A negative or
// huge `extra` must fail as out of memory, never write past the block.
class Scratched {
 public:
  Scratched(const fusekit::Attrs& attrs, std::string*) : extra_(attrs.Int("extra")) {}

  TfLiteStatus Prepare(fusekit::OpContext& ctx, In<float> x, Out<float> y) {
    FUSEKIT_ENSURE_EQ(ctx, x.rank(), 2);
    return ctx.ResizeOutput(y, x.shape());
  }

  TfLiteStatus Invoke(fusekit::OpContext& ctx, In<float> x, Out<float> y) {
    const int64_t width = x.dim(1);
    fusekit::ScratchLayout layout;
    const auto shared = layout.Add<double>(extra_);
    const auto rows = layout.Add<float>(width, ctx.num_threads());
    void* base = ctx.Scratch(layout);
    FUSEKIT_ENSURE(ctx, base != nullptr, "out of memory for %zu bytes of scratch",
                   layout.bytes());
    double* d = shared(base);
    for (int64_t i = 0; i < extra_; ++i) d[i] = -1.0;
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; };
    FUSEKIT_ENSURE(ctx, aligned(d), "shared array misaligned");
    bool ok = true;
    ctx.ParallelFor(x.dim(0), 1, [&](int64_t begin, int64_t end, int worker) {
      float* row = rows(base, worker);
      if (!aligned(row) || reinterpret_cast<char*>(row) < reinterpret_cast<char*>(d + extra_) ||
          (worker > 0 && row < rows(base, worker - 1) + width)) {
        ok = false;
      }
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < width; ++c) row[c] = 2.0f * x.data()[r * width + c];
        for (int64_t c = 0; c < width; ++c) y.data()[r * width + c] = row[c];
      }
    });
    for (int64_t i = 0; i < extra_; ++i) ok = ok && d[i] == -1.0;
    FUSEKIT_ENSURE(ctx, ok, "scratch arrays overlap or are misaligned");
    return kTfLiteOk;
  }

 private:
  int64_t extra_;
};

FUSEKIT_REGISTER_KERNEL("sdk_scratch", Scratched, fusekit::Inputs("x"), fusekit::Outputs("y"),
                        fusekit::AttrSchema(fusekit::attr::Int("extra", 0)));

}  // namespace
