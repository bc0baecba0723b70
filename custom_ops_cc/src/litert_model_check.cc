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

}  // namespace

std::string CheckModelForLiteRt(const uint8_t* data, size_t size) {
  const std::string malformed = "the model is not a valid .tflite flatbuffer";
  if (data == nullptr || size < 8) return malformed + " (too small)";
  Reader r(data, size);
  const Table* model = r.Root();
  std::vector<std::string> custom;
  const Tables* subgraphs = nullptr;
  if (model == nullptr || !CustomCodeNames(r, model, &custom) ||
      !r.TablesOf(model, kModelSubgraphs, &subgraphs)) {
    return malformed;
  }
  for (flatbuffers::uoffset_t s = 0; subgraphs != nullptr && s < subgraphs->size(); ++s) {
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
