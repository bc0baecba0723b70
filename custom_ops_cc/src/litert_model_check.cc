// The one rule a valid .tflite can break under LiteRT's CompiledModel with
// custom-op kernels: a custom op must not list tensor index -1 (an input left
// out) among its inputs.  Absent optional inputs at the end are left off the
// list instead, which is what fusekit writes; an absent input before a
// present one (a norm with beta but no gamma) cannot be left off, so fusekit
// writes a neutral tensor there (ones for gamma).
//
// Why a check on the model and not a refusal in the adapter: LiteRT's
// custom-op dispatcher (ai-edge-litert 2.3) fetches every input tensor of a
// custom node to build the input layouts it hands GetOutputLayouts, and
// dereferences the null tensor that stands for a -1 input.  That happens
// when the nodes are prepared (the first LiteRtGetCompiledModel*Layouts or
// run), after Init and before any other kernel callback, and Init sees only
// the node's custom options, not its inputs.  No callback can refuse such a
// node, so apps check the model before compiling it
// (fusekit_litert_check_model); fusekit.CompiledModel calls the same check.
//
// The check also covers quantization details that name other tensors of
// the subgraph by index (blockwise and multi-axis scales and zero points):
// the runtime follows those indices unchecked when it first runs the model,
// so a bad one crashes it.  Each must name another constant tensor of the
// subgraph of a float (scales) or integer (zero points) type.
#include "litert_model_check.h"

#include <algorithm>
#include <vector>

#include "fusekit/kernel_sdk.h"
#include "tflite_reader.h"

namespace fusekit {
namespace {

using namespace tflite_fields;
using Reader = TfliteReader;
using flatbuffers::Table;
using flatbuffers::Vector;

std::string InputName(const std::string& op, size_t j) {
  const KernelDef* def = FindKernel(op.c_str());
  if (def == nullptr || j >= def->input_names.size()) return std::to_string(j);
  return std::to_string(j) + " ('" + def->input_names[j] + "')";
}

constexpr uint8_t kBlockwise = 2;
constexpr uint8_t kMultiAxis = 3;

// TensorType names, by value.
const char* TypeName(int8_t type) {
  static const char* const kNames[] = {
      "FLOAT32", "FLOAT16",    "INT32",  "UINT8",    "INT64",  "STRING", "BOOL",  "INT16",
      "COMPLEX64", "INT8",     "FLOAT64", "COMPLEX128", "UINT64", "RESOURCE", "VARIANT",
      "UINT32", "UINT16",      "INT4",   "BFLOAT16", "INT2",   "UINT4",  "FLOAT8_E4M3FN",
      "FLOAT8_E5M2"};
  const size_t count = sizeof(kNames) / sizeof(kNames[0]);
  return type >= 0 && static_cast<size_t>(type) < count ? kNames[type] : "unknown type";
}

bool IsFloat(int8_t type) { return type == 0 || type == 1 || type == 18; }  // F32, F16, BF16

bool IsInteger(int8_t type) {
  // INT32, UINT8, INT64, INT16, INT8, INT4, INT2, UINT4.
  return type == 2 || type == 3 || type == 4 || type == 7 || type == 9 || type == 17 ||
         type == 19 || type == 20;
}

// Whether tensor `t` holds constant data: a buffer with a data vector (even
// empty) or data placed after the flatbuffer.  False if malformed.
bool IsConstant(Reader& r, const Table* t, const Tables* buffers, bool* constant) {
  uint32_t index = 0;
  if (!r.Scalar(t, kTensorBuffer, &index)) return false;
  *constant = false;
  if (buffers == nullptr || index >= buffers->size()) return true;
  uint64_t offset = 0;
  bool data = false;
  if (!r.Scalar(buffers->Get(index), kBufferOffset, &offset) ||
      !r.HasVector(buffers->Get(index), kBufferData, &data)) {
    return false;
  }
  *constant = data || offset > 1;
  return true;
}

// The problem with the quantization details of `subgraph`'s tensors ("" if
// none); false if the flatbuffer is malformed.
bool DetailsProblem(Reader& r, const Table* subgraph, size_t s, const Tables* buffers,
                    std::string* problem) {
  const Tables* tensors = nullptr;
  if (!r.TablesOf(subgraph, kSubgraphTensors, &tensors)) return false;
  const size_t count = tensors == nullptr ? 0 : tensors->size();
  for (flatbuffers::uoffset_t i = 0; i < count; ++i) {
    const Table* quantization = nullptr;
    if (!r.TableOf(tensors->Get(i), kTensorQuantization, &quantization)) return false;
    if (quantization == nullptr) continue;
    uint8_t type = 0;
    if (!r.Scalar(quantization, kQuantizationDetailsType, &type)) return false;
    if (type != kBlockwise && type != kMultiAxis) continue;
    const Table* details = nullptr;
    if (!r.TableOf(quantization, kQuantizationDetails, &details)) return false;
    const std::string kind = type == kBlockwise ? "BlockwiseQuantization" : "MultiAxisQuantization";
    std::string name;
    if (!r.StringOf(tensors->Get(i), kTensorName, &name)) return false;
    const std::string where = "subgraph " + std::to_string(s) + " tensor " + std::to_string(i) +
                              " ('" + name + "'): " + kind;
    if (details == nullptr) {
      *problem = where + " has no details table";
      return true;
    }
    struct Ref {
      voffset_t field;
      const char* name;
      bool required;  // else -1 means none
      bool (*kind)(int8_t);
      const char* kinds;
    };
    const Ref refs[] = {
        {kDetailsScales, "scales", true, IsFloat, "FLOAT32 / FLOAT16 / BFLOAT16"},
        {kDetailsZeroPoints, "zero_points", false, IsInteger, "an integer type"},
    };
    for (const Ref& ref : refs) {
      int32_t index = 0;
      if (!r.Scalar(details, ref.field, &index)) return false;
      if (index == -1 && !ref.required) continue;
      const std::string named = where + "." + ref.name + " names tensor " + std::to_string(index);
      if (index < 0 || static_cast<size_t>(index) >= count) {
        *problem = named + ", out of range (subgraph " + std::to_string(s) + " has " +
                   std::to_string(count) + " tensors)";
        return true;
      }
      int8_t named_type = 0;
      bool constant = false;
      const Table* target = tensors->Get(static_cast<flatbuffers::uoffset_t>(index));
      if (!r.Scalar(target, kTensorType, &named_type) ||
          !IsConstant(r, target, buffers, &constant)) {
        return false;
      }
      if (static_cast<flatbuffers::uoffset_t>(index) == i || !constant ||
          !ref.kind(named_type)) {
        *problem = named + " (a " + TypeName(named_type) + " " +
                   (constant ? "constant" : "tensor without data") +
                   "); it must be another constant tensor of " + ref.kinds +
                   ": LiteRT follows it unchecked and crashes";
        return true;
      }
    }
  }
  return true;
}

}  // namespace

std::string CheckModelForLiteRt(const uint8_t* data, size_t size) {
  const std::string malformed = "the model is not a valid .tflite flatbuffer";
  if (data == nullptr || size < 8) return malformed + " (too small)";
  Reader r(data, size);
  const Table* model = r.Root();
  std::vector<std::string> custom;
  const Tables* subgraphs = nullptr;
  const Tables* buffers = nullptr;
  if (model == nullptr || !CustomCodeNames(r, model, &custom) ||
      !r.TablesOf(model, kModelSubgraphs, &subgraphs) ||
      !r.TablesOf(model, kModelBuffers, &buffers)) {
    return malformed;
  }
  for (flatbuffers::uoffset_t s = 0; subgraphs != nullptr && s < subgraphs->size(); ++s) {
    std::string problem;
    if (!DetailsProblem(r, subgraphs->Get(s), s, buffers, &problem)) return malformed;
    if (!problem.empty()) return problem;
    const Tables* ops = nullptr;
    if (!r.TablesOf(subgraphs->Get(s), kSubgraphOperators, &ops)) return malformed;
    for (flatbuffers::uoffset_t k = 0; ops != nullptr && k < ops->size(); ++k) {
      const Table* op = ops->Get(k);
      uint32_t opcode = 0;
      const Vector<int32_t>* inputs = nullptr;
      if (!r.Scalar(op, kOperatorOpcodeIndex, &opcode) || !r.IntsOf(op, kOperatorInputs, &inputs)) {
        return malformed;
      }
      const std::string node = "subgraph " + std::to_string(s) + " operator " + std::to_string(k);
      if (opcode >= custom.size()) {
        return malformed + ": " + node + " has opcode index " + std::to_string(opcode) +
               " (the model has " + std::to_string(custom.size()) + " operator codes)";
      }
      const std::string& name = custom[opcode];
      if (name.empty() || inputs == nullptr) continue;
      for (flatbuffers::uoffset_t j = 0; j < inputs->size(); ++j) {
        const int32_t t = inputs->Get(j);
        if (t == -1) {
          return name + ": " + node + " input " + InputName(name, j) +
                 " is tensor index -1 (left out), which LiteRT's CompiledModel "
                 "crashes on: leave absent inputs off the end of the list, give an "
                 "absent input before a present one a tensor (fusekit writes ones "
                 "for a missing gamma), or run the model with a TFLite interpreter";
        }
        if (t < 0) {
          return malformed + ": " + name + " " + node + " input " + std::to_string(j) +
                 " is tensor index " + std::to_string(t);
        }
      }
    }
  }
  return std::string();
}

}  // namespace fusekit
