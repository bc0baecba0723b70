// Bounds-checked reading of a .tflite flatbuffer without generated code:
// the field ids of the TFLite schema (schema.fbs) the adapters read, and a
// reader that verifies every table, vector and string before it is read.
#ifndef FUSEKIT_SRC_TFLITE_READER_H_
#define FUSEKIT_SRC_TFLITE_READER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flatbuffers/flatbuffers.h"

namespace fusekit {
namespace tflite_fields {

using flatbuffers::voffset_t;

// The vtable offset of field number `id` of a table.
constexpr voffset_t Field(int id) { return static_cast<voffset_t>(4 + 2 * id); }

constexpr voffset_t kModelOperatorCodes = Field(1);
constexpr voffset_t kModelSubgraphs = Field(2);
constexpr voffset_t kModelBuffers = Field(4);
constexpr voffset_t kCodeDeprecatedBuiltin = Field(0);
constexpr voffset_t kCodeCustomCode = Field(1);
constexpr voffset_t kCodeVersion = Field(2);
constexpr voffset_t kCodeBuiltin = Field(3);
constexpr int kCodeFields = 4;
constexpr voffset_t kSubgraphTensors = Field(0);
constexpr voffset_t kSubgraphOperators = Field(3);
constexpr voffset_t kTensorType = Field(1);
constexpr voffset_t kTensorBuffer = Field(2);
constexpr voffset_t kTensorName = Field(3);
constexpr voffset_t kTensorQuantization = Field(4);
constexpr voffset_t kQuantizationDetailsType = Field(4);
constexpr voffset_t kQuantizationDetails = Field(5);
// BlockwiseQuantization and MultiAxisQuantization alike.
constexpr voffset_t kDetailsScales = Field(0);
constexpr voffset_t kDetailsZeroPoints = Field(1);
constexpr voffset_t kBufferData = Field(0);
constexpr voffset_t kOperatorOpcodeIndex = Field(0);
constexpr voffset_t kOperatorInputs = Field(1);
constexpr voffset_t kOperatorLargeCustomOptionsOffset = Field(9);
constexpr voffset_t kBufferOffset = Field(1);
constexpr int32_t kBuiltinCustom = 32;

}  // namespace tflite_fields

using Tables = flatbuffers::Vector<flatbuffers::Offset<flatbuffers::Table>>;

// Reads tables, vectors and scalars only after the verifier has checked that
// they lie inside the buffer (an offset too: GetPointer follows it).
class TfliteReader {
 public:
  TfliteReader(const uint8_t* data, size_t size)
      : data_(data),
        verifier_(data, std::min<size_t>(size, FLATBUFFERS_MAX_BUFFER_SIZE - 1), Options()) {}

  const flatbuffers::Table* Root() {
    // A model over 2 GB keeps its weights after the flatbuffer: every offset
    // a reader follows lies in the first 2 GB.
    if (verifier_.VerifyOffset(0) == 0) return nullptr;
    const auto* root = flatbuffers::GetRoot<flatbuffers::Table>(data_);
    return Start(root) ? root : nullptr;
  }

  // The tables of a vector field (null when absent); false if malformed.
  bool TablesOf(const flatbuffers::Table* t, flatbuffers::voffset_t field, const Tables** out) {
    if (!t->VerifyOffset(verifier_, field)) return false;
    *out = t->GetPointer<const Tables*>(field);
    if (!verifier_.VerifyVector(*out)) return false;
    if (*out == nullptr) return true;
    for (flatbuffers::uoffset_t i = 0; i < (*out)->size(); ++i) {
      if (!Start((*out)->Get(i))) return false;
    }
    return true;
  }

  // A table field (null when absent); false if malformed.
  bool TableOf(const flatbuffers::Table* t, flatbuffers::voffset_t field,
               const flatbuffers::Table** out) {
    if (!t->VerifyOffset(verifier_, field)) return false;
    *out = t->GetPointer<const flatbuffers::Table*>(field);
    return *out == nullptr || Start(*out);
  }

  // Whether a vector field is present (of any element type); false if
  // malformed.
  bool HasVector(const flatbuffers::Table* t, flatbuffers::voffset_t field, bool* present) {
    const flatbuffers::Vector<uint8_t>* v = nullptr;
    if (!VectorOf<uint8_t>(t, field, &v)) return false;
    *present = v != nullptr;
    return true;
  }

  // A vector of scalars (null when absent); false if malformed.
  template <typename T>
  bool VectorOf(const flatbuffers::Table* t, flatbuffers::voffset_t field,
                const flatbuffers::Vector<T>** out) {
    if (!t->VerifyOffset(verifier_, field)) return false;
    *out = t->GetPointer<const flatbuffers::Vector<T>*>(field);
    return verifier_.VerifyVector(*out);
  }

  bool IntsOf(const flatbuffers::Table* t, flatbuffers::voffset_t field,
              const flatbuffers::Vector<int32_t>** out) {
    return VectorOf<int32_t>(t, field, out);
  }

  template <typename T>
  bool Scalar(const flatbuffers::Table* t, flatbuffers::voffset_t field, T* out) {
    if (!t->VerifyField<T>(verifier_, field, sizeof(T))) return false;
    *out = t->GetField<T>(field, 0);
    return true;
  }

  // A string field; *present says whether the table has it at all.
  bool StringOf(const flatbuffers::Table* t, flatbuffers::voffset_t field, std::string* out,
                bool* present = nullptr) {
    if (!t->VerifyOffset(verifier_, field)) return false;
    const auto* s = t->GetPointer<const flatbuffers::String*>(field);
    if (!verifier_.VerifyString(s)) return false;
    *out = s == nullptr ? "" : s->str();
    if (present != nullptr) *present = s != nullptr;
    return true;
  }

 private:
  static flatbuffers::Verifier::Options Options() {
    flatbuffers::Verifier::Options o;
    o.max_tables = 1u << 30;  // a table per operator: large models have many
    return o;
  }
  bool Start(const flatbuffers::Table* t) {
    if (t == nullptr || !t->VerifyTableStart(verifier_)) return false;
    verifier_.EndTable();  // tables are checked one at a time, not nested
    return true;
  }

  const uint8_t* data_;
  flatbuffers::Verifier verifier_;
};

// Number of fields a table's vtable has room for (present or not).
inline int VtableFields(const flatbuffers::Table* t) {
  const uint8_t* vtable = t->GetVTable();
  return (flatbuffers::ReadScalar<flatbuffers::voffset_t>(vtable) - 4) / 2;
}

// The custom op names by operator code index ("" for builtins).
inline bool CustomCodeNames(TfliteReader& r, const flatbuffers::Table* model,
                            std::vector<std::string>* names) {
  const Tables* codes = nullptr;
  if (!r.TablesOf(model, tflite_fields::kModelOperatorCodes, &codes)) return false;
  for (flatbuffers::uoffset_t c = 0; codes != nullptr && c < codes->size(); ++c) {
    const flatbuffers::Table* code = codes->Get(c);
    int8_t deprecated = 0;
    int32_t builtin = 0;
    std::string name;
    if (!r.Scalar(code, tflite_fields::kCodeDeprecatedBuiltin, &deprecated) ||
        !r.Scalar(code, tflite_fields::kCodeBuiltin, &builtin) ||
        !r.StringOf(code, tflite_fields::kCodeCustomCode, &name)) {
      return false;
    }
    // Small codes live in the deprecated int8 field, large ones in the int32
    // field: the larger is the real one.
    const bool custom = std::max<int32_t>(deprecated, builtin) == tflite_fields::kBuiltinCustom;
    names->push_back(custom ? (name.empty() ? std::string("(unnamed custom op)") : name)
                            : std::string());
  }
  return true;
}

}  // namespace fusekit

#endif  // FUSEKIT_SRC_TFLITE_READER_H_
