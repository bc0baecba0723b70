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
// The second rule: every tensor a signature names must be an input (or
// output) of its subgraph, and every signature and tensor-map entry must
// carry its name.  ai-edge-quantizer (static int8/int16 recipes) appends a
// DEQUANTIZE after a float output, makes the new tensor the subgraph's
// output and leaves the signature pointing at the old, now int8, tensor.
// LiteRT's CompiledModel reads such a model, then builds the output layouts
// (LiteRtGetCompiledModelOutputTensorLayouts, or creating output buffers)
// from a null name: a C++ exception escapes its C API and aborts the
// process.  A missing key or tensor-map name ends the same way.
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

// Why the signature defs break the second rule (see the top), or "".
std::string CheckSignatures(Reader& r, const Table* model, const Tables* subgraphs,
                            const std::string& malformed) {
  const Tables* signatures = nullptr;
  if (!r.TablesOf(model, kModelSignatureDefs, &signatures)) return malformed;
  const flatbuffers::uoffset_t num_subgraphs = subgraphs == nullptr ? 0 : subgraphs->size();
  for (flatbuffers::uoffset_t s = 0; signatures != nullptr && s < signatures->size(); ++s) {
    const Table* sig = signatures->Get(s);
    std::string key;
    bool has_key = false;
    uint32_t index = 0;
    if (!r.StringOf(sig, kSignatureKey, &key, &has_key) ||
        !r.Scalar(sig, kSignatureSubgraphIndex, &index)) {
      return malformed;
    }
    const std::string where = "signature " + std::to_string(s) +
                              (has_key ? " ('" + key + "')" : std::string());
    if (!has_key) {
      return where + " has no signature key, which LiteRT's CompiledModel aborts on";
    }
    if (index >= num_subgraphs) {
      return malformed + ": " + where + " names subgraph " + std::to_string(index) +
             " (the model has " + std::to_string(num_subgraphs) + ")";
    }
    const Table* subgraph = subgraphs->Get(index);
    const Tables* tensors = nullptr;
    if (!r.TablesOf(subgraph, kSubgraphTensors, &tensors)) return malformed;
    const int64_t num_tensors = tensors == nullptr ? 0 : tensors->size();
    const struct {
      voffset_t sig_field, subgraph_field;
      const char* side;
    } sides[] = {{kSignatureInputs, kSubgraphInputs, "input"},
                 {kSignatureOutputs, kSubgraphOutputs, "output"}};
    for (const auto& side : sides) {
      const Tables* maps = nullptr;
      const Vector<int32_t>* ends = nullptr;
      if (!r.TablesOf(sig, side.sig_field, &maps) ||
          !r.IntsOf(subgraph, side.subgraph_field, &ends)) {
        return malformed;
      }
      for (flatbuffers::uoffset_t j = 0; maps != nullptr && j < maps->size(); ++j) {
        std::string name;
        bool has_name = false;
        uint32_t tensor = 0;
        if (!r.StringOf(maps->Get(j), kTensorMapName, &name, &has_name) ||
            !r.Scalar(maps->Get(j), kTensorMapTensorIndex, &tensor)) {
          return malformed;
        }
        const std::string entry = where + " " + side.side + " " + std::to_string(j);
        if (!has_name) {
          return entry + " has no name, which LiteRT's CompiledModel aborts on";
        }
        if (static_cast<int64_t>(tensor) >= num_tensors) {
          return malformed + ": " + entry + " ('" + name + "') is tensor " +
                 std::to_string(tensor) + " (its subgraph has " + std::to_string(num_tensors) +
                 " tensors)";
        }
        const bool listed = ends != nullptr && std::find(ends->begin(), ends->end(),
                                                         static_cast<int32_t>(tensor)) !=
                                                   ends->end();
        if (!listed) {
          return entry + " ('" + name + "') is tensor " + std::to_string(tensor) +
                 ", which is not an " + side.side + " of subgraph " + std::to_string(index) +
                 ": the signature and its subgraph disagree (ai-edge-quantizer's static "
                 "recipes write such models), and LiteRT's CompiledModel aborts on them. "
                 "Point the signature at the subgraph's " + side.side +
                 " tensors, or run the model with a TFLite interpreter";
        }
      }
    }
  }
  return std::string();
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
  return CheckSignatures(r, model, subgraphs, malformed);
}

}  // namespace fusekit
