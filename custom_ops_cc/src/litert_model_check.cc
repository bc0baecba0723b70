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

#include "flatbuffers/flatbuffers.h"
#include "fusekit/kernel_sdk.h"

namespace fusekit {
namespace {

using flatbuffers::Offset;
using flatbuffers::String;
using flatbuffers::Table;
using flatbuffers::Vector;
using flatbuffers::voffset_t;

// Field ids of the TFLite schema (schema.fbs) this check reads.
constexpr voffset_t Field(int id) { return static_cast<voffset_t>(4 + 2 * id); }
constexpr voffset_t kModelOperatorCodes = Field(1);
constexpr voffset_t kModelSubgraphs = Field(2);
constexpr voffset_t kCodeDeprecatedBuiltin = Field(0);
constexpr voffset_t kCodeCustomCode = Field(1);
constexpr voffset_t kCodeBuiltin = Field(3);
constexpr voffset_t kSubgraphOperators = Field(3);
constexpr voffset_t kOperatorOpcodeIndex = Field(0);
constexpr voffset_t kOperatorInputs = Field(1);
constexpr int32_t kBuiltinCustom = 32;

using Tables = Vector<Offset<Table>>;

// Reads tables, vectors and scalars only after the verifier has checked that
// they lie inside the buffer (an offset too: GetPointer follows it).
class Reader {
 public:
  Reader(const uint8_t* data, size_t size)
      : data_(data),
        verifier_(data, std::min<size_t>(size, FLATBUFFERS_MAX_BUFFER_SIZE - 1), Options()) {}

  const Table* Root() {
    // A model over 2 GB keeps its weights after the flatbuffer: every offset
    // the check follows lies in the first 2 GB.
    if (verifier_.VerifyOffset(0) == 0) return nullptr;
    const Table* root = flatbuffers::GetRoot<Table>(data_);
    return Start(root) ? root : nullptr;
  }

  // The tables of a vector field (empty when absent); false if malformed.
  bool TablesOf(const Table* t, voffset_t field, const Tables** out) {
    if (!t->VerifyOffset(verifier_, field)) return false;
    *out = t->GetPointer<const Tables*>(field);
    if (!verifier_.VerifyVector(*out)) return false;
    if (*out == nullptr) return true;
    for (flatbuffers::uoffset_t i = 0; i < (*out)->size(); ++i) {
      if (!Start((*out)->Get(i))) return false;
    }
    return true;
  }

  bool IntsOf(const Table* t, voffset_t field, const Vector<int32_t>** out) {
    if (!t->VerifyOffset(verifier_, field)) return false;
    *out = t->GetPointer<const Vector<int32_t>*>(field);
    return verifier_.VerifyVector(*out);
  }

  template <typename T>
  bool Scalar(const Table* t, voffset_t field, T* out) {
    if (!t->VerifyField<T>(verifier_, field, sizeof(T))) return false;
    *out = t->GetField<T>(field, 0);
    return true;
  }

  bool StringOf(const Table* t, voffset_t field, std::string* out) {
    if (!t->VerifyOffset(verifier_, field)) return false;
    const auto* s = t->GetPointer<const String*>(field);
    if (!verifier_.VerifyString(s)) return false;
    *out = s == nullptr ? "" : s->str();
    return true;
  }

 private:
  static flatbuffers::Verifier::Options Options() {
    flatbuffers::Verifier::Options o;
    o.max_tables = 1u << 30;  // a table per operator: large models have many
    return o;
  }
  bool Start(const Table* t) {
    if (t == nullptr || !t->VerifyTableStart(verifier_)) return false;
    verifier_.EndTable();  // tables are checked one at a time, not nested
    return true;
  }

  const uint8_t* data_;
  flatbuffers::Verifier verifier_;
};

// The custom op names by operator code index ("" for builtins).
bool CustomNames(Reader& r, const Table* model, std::vector<std::string>* names) {
  const Tables* codes = nullptr;
  if (!r.TablesOf(model, kModelOperatorCodes, &codes)) return false;
  for (flatbuffers::uoffset_t c = 0; codes != nullptr && c < codes->size(); ++c) {
    const Table* code = codes->Get(c);
    int8_t deprecated = 0;
    int32_t builtin = 0;
    std::string name;
    if (!r.Scalar(code, kCodeDeprecatedBuiltin, &deprecated) ||
        !r.Scalar(code, kCodeBuiltin, &builtin) || !r.StringOf(code, kCodeCustomCode, &name)) {
      return false;
    }
    // Small codes live in the deprecated int8 field, large ones in the int32
    // field: the larger is the real one.
    const bool custom = std::max<int32_t>(deprecated, builtin) == kBuiltinCustom;
    names->push_back(custom ? (name.empty() ? std::string("(unnamed custom op)") : name)
                            : std::string());
  }
  return true;
}

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
  if (model == nullptr || !CustomNames(r, model, &custom) ||
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
