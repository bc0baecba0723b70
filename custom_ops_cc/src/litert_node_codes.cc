// Gives every custom-op node a fusekit library serves its own custom code.
//
// A flatbuffer's offsets point forward only, so nothing already in the
// buffer can be made to point at a new object placed before it; new objects
// go into a region after the flatbuffer, and the fields that must reach them
// (Model.operator_codes, the entries of SubGraph.operators naming a renamed
// node) are offsets rewritten in place.  The region holds a copy of every
// operator code (the new vector must point forward at them), one new code
// per renamed node, and a copy of each renamed operator with its new
// opcode_index.  A model whose weights sit after the flatbuffer (Buffer.offset,
// Operator.large_custom_options_offset: positions from the start of the
// file) gets the region between the flatbuffer and the weights, and those
// positions move by the region's size, a multiple of 64 bytes so that the
// weights keep their alignment.
#include "litert_node_codes.h"

#include <cstring>
#include <limits>

#include "flatbuffers/flatbuffers.h"
#include "tflite_reader.h"

namespace fusekit {
namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;
using flatbuffers::Table;
using flatbuffers::uoffset_t;
using flatbuffers::Vector;
using flatbuffers::voffset_t;
using namespace tflite_fields;

constexpr size_t kAlign = 64;

// How each field of Operator (schema.fbs, field ids 0..13) is copied.
enum class Kind { kU8, kI8, kI32, kU32, kU64, kPosition, kInts, kBytes, kUnion };
constexpr Kind kOperatorFields[] = {
    Kind::kU32,       // opcode_index (replaced)
    Kind::kInts,      // inputs
    Kind::kInts,      // outputs
    Kind::kU8,        // builtin_options_type
    Kind::kUnion,     // builtin_options
    Kind::kBytes,     // custom_options
    Kind::kI8,        // custom_options_format
    Kind::kBytes,     // mutating_variable_inputs ([bool])
    Kind::kInts,      // intermediates
    Kind::kPosition,  // large_custom_options_offset (from the file start)
    Kind::kU64,       // large_custom_options_size
    Kind::kU8,        // builtin_options_2_type
    Kind::kUnion,     // builtin_options_2
    Kind::kI32,       // debug_metadata_index
};
constexpr int kOperatorFieldCount = sizeof(kOperatorFields) / sizeof(kOperatorFields[0]);

bool HasField(const Table* t, voffset_t field) { return t->GetOptionalFieldOffset(field) != 0; }

// The fields of a table beyond the first `known` ones that it carries.
bool HasUnknownFields(const Table* t, int known) {
  for (int id = known; id < VtableFields(t); ++id) {
    if (HasField(t, Field(id))) return true;
  }
  return false;
}

struct Node {
  uint32_t subgraph, index;
  const Table* op;
  const Vector<Offset<Table>>* list;  // the subgraph's operators
  std::string name;
  int32_t version;
};

class Rewriter {
 public:
  Rewriter(const uint8_t* data, size_t size) : data_(data), size_(size), reader_(data, size) {}

  NodeCodedModel Run(const std::function<bool(const std::string&)>& serves) {
    NodeCodedModel out;
    model_ = reader_.Root();
    std::vector<std::string> custom;
    if (model_ == nullptr || !CustomCodeNames(reader_, model_, &custom) ||
        !reader_.TablesOf(model_, kModelOperatorCodes, &codes_) ||
        !reader_.TablesOf(model_, kModelSubgraphs, &subgraphs_) ||
        !reader_.TablesOf(model_, kModelBuffers, &buffers_)) {
      return Fail("the model is not a valid .tflite flatbuffer");
    }
    std::vector<Node> nodes;
    for (uoffset_t s = 0; subgraphs_ != nullptr && s < subgraphs_->size(); ++s) {
      const Tables* ops = nullptr;
      if (!reader_.TablesOf(subgraphs_->Get(s), kSubgraphOperators, &ops)) {
        return Fail("the model is not a valid .tflite flatbuffer");
      }
      for (uoffset_t k = 0; ops != nullptr && k < ops->size(); ++k) {
        uint32_t opcode = 0;
        if (!reader_.Scalar(ops->Get(k), kOperatorOpcodeIndex, &opcode) ||
            opcode >= custom.size()) {
          return Fail("the model is not a valid .tflite flatbuffer (subgraph " +
                      std::to_string(s) + " operator " + std::to_string(k) +
                      " has no operator code)");
        }
        if (custom[opcode].empty() || !serves(custom[opcode])) continue;
        int32_t version = 1;
        if (!reader_.Scalar(codes_->Get(opcode), kCodeVersion, &version)) {
          return Fail("the model is not a valid .tflite flatbuffer");
        }
        if (!HasField(codes_->Get(opcode), kCodeVersion)) version = 1;
        nodes.push_back(Node{s, k, ops->Get(k), ops, custom[opcode], version});
      }
    }
    if (!FindFlatbufferEnd()) return Fail("the model is not a valid .tflite flatbuffer");
    if (nodes.empty()) return Copy();

    FlatBufferBuilder fbb(4096);
    std::vector<Offset<Table>> codes;
    for (uoffset_t c = 0; c < codes_->size(); ++c) {
      const Table* code = codes_->Get(c);
      if (HasUnknownFields(code, kCodeFields)) {
        return Fail("operator code " + std::to_string(c) +
                    " has fields this fusekit does not know (a newer schema): update fusekit");
      }
      Offset<Table> copy;
      if (!CopyCode(fbb, code, &copy)) return Fail("the model is not a valid .tflite flatbuffer");
      codes.push_back(copy);
    }
    std::vector<Offset<Table>> operators;
    for (const Node& n : nodes) {
      CodedNode coded;
      coded.op = n.name;
      coded.code = n.name + "@s" + std::to_string(n.subgraph) + ".op" + std::to_string(n.index);
      coded.subgraph = n.subgraph;
      coded.op_index = n.index;
      coded.version = n.version;
      codes.push_back(NewCode(fbb, coded.code, n.version));
      std::string problem;
      operators.push_back(CopyOperator(fbb, n.op, static_cast<uint32_t>(codes.size() - 1),
                                       &problem));
      if (!problem.empty()) {
        return Fail(n.name + ": subgraph " + std::to_string(n.subgraph) + " operator " +
                    std::to_string(n.index) + " " + problem);
      }
      out.nodes.push_back(std::move(coded));
    }
    const Offset<Vector<Offset<Table>>> code_vector = fbb.CreateVector(codes);

    // [flatbuffer][pad][region][weights...]: the region ends at a multiple
    // of kAlign (the builder aligns every object from the region's end).
    const size_t region = fbb.GetSize();
    const size_t end = end_ + region;
    const size_t shift = (end + kAlign - 1) / kAlign * kAlign - end_;
    if (end_ + shift > std::numeric_limits<int32_t>::max()) {
      return Fail("the model's flatbuffer is too large to give its nodes their own codes");
    }
    out.size = size_ + shift;
    out.data.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, Rounded(out.size))));
    if (out.data == nullptr) return Fail("out of memory copying the model");
    uint8_t* dst = out.data.get();
    std::memcpy(dst, data_, end_);
    std::memset(dst + end_, 0, shift - region);
    const size_t region_start = end_ + shift - region;
    std::memcpy(dst + region_start, fbb.GetCurrentBufferPointer(), region);
    std::memcpy(dst + end_ + shift, data_ + end_, size_ - end_);
    auto at = [&](uoffset_t o) { return region_start + region - o; };  // builder offset

    PointAt(dst, model_->GetAddressOf(kModelOperatorCodes), at(code_vector.o));
    std::vector<size_t> copies;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const uint8_t* entry = reinterpret_cast<const uint8_t*>(nodes[i].list->Data()) +
                             sizeof(uoffset_t) * nodes[i].index;
      copies.push_back(at(operators[i].o));
      PointAt(dst, entry, copies.back());
    }
    if (end_ < size_) MovePositions(dst, shift, copies);
    out.error.clear();
    return out;
  }

 private:
  static size_t Rounded(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  // The model unchanged (in memory LiteRT may read in place).
  NodeCodedModel Copy() {
    NodeCodedModel out;
    out.size = size_;
    out.data.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, Rounded(size_))));
    if (out.data == nullptr) return Fail("out of memory copying the model");
    std::memcpy(out.data.get(), data_, size_);
    return out;
  }

  NodeCodedModel Fail(const std::string& why) {
    NodeCodedModel out;
    out.error = why;
    return out;
  }

  // Where the flatbuffer ends: the first weight stored past it, else the
  // end of the buffer.
  bool FindFlatbufferEnd() {
    end_ = size_;
    for (uoffset_t b = 0; buffers_ != nullptr && b < buffers_->size(); ++b) {
      uint64_t offset = 0;
      if (!reader_.Scalar(buffers_->Get(b), kBufferOffset, &offset)) return false;
      if (offset > 1 && offset < end_) end_ = offset;
    }
    for (uoffset_t s = 0; subgraphs_ != nullptr && s < subgraphs_->size(); ++s) {
      const Tables* ops = nullptr;
      if (!reader_.TablesOf(subgraphs_->Get(s), kSubgraphOperators, &ops)) return false;
      for (uoffset_t k = 0; ops != nullptr && k < ops->size(); ++k) {
        uint64_t offset = 0;
        if (!reader_.Scalar(ops->Get(k), kOperatorLargeCustomOptionsOffset, &offset)) {
          return false;
        }
        if (offset > 1 && offset < end_) end_ = offset;
      }
    }
    return true;
  }

  // Rewrites the uoffset at `field` (an address in the input) so that it
  // points at position `target` of the output.
  void PointAt(uint8_t* dst, const uint8_t* field, size_t target) {
    const size_t position = static_cast<size_t>(field - data_);
    flatbuffers::WriteScalar<uoffset_t>(dst + position,
                                        static_cast<uoffset_t>(target - position));
  }

  // Positions past the flatbuffer (weights) move by `shift`: in the
  // input's tables (at the same place in the output) and in the copies of
  // renamed operators (`copies`: their positions in the output).
  void MovePositions(uint8_t* dst, size_t shift, const std::vector<size_t>& copies) {
    auto move = [&](uint8_t* p) {
      if (p == nullptr) return;
      const uint64_t value = flatbuffers::ReadScalar<uint64_t>(p);
      if (value > 1 && value >= end_) flatbuffers::WriteScalar<uint64_t>(p, value + shift);
    };
    auto in_output = [&](const Table* t, voffset_t field) -> uint8_t* {
      const uint8_t* p = t->GetAddressOf(field);
      return p == nullptr ? nullptr : dst + (p - data_);
    };
    for (uoffset_t b = 0; buffers_ != nullptr && b < buffers_->size(); ++b) {
      move(in_output(buffers_->Get(b), kBufferOffset));
    }
    for (uoffset_t s = 0; subgraphs_ != nullptr && s < subgraphs_->size(); ++s) {
      const Tables* ops = nullptr;
      reader_.TablesOf(subgraphs_->Get(s), kSubgraphOperators, &ops);  // verified before
      for (uoffset_t k = 0; ops != nullptr && k < ops->size(); ++k) {
        move(in_output(ops->Get(k), kOperatorLargeCustomOptionsOffset));
      }
    }
    for (size_t position : copies) {
      auto* copy = reinterpret_cast<Table*>(dst + position);
      move(copy->GetAddressOf(kOperatorLargeCustomOptionsOffset));
    }
  }

  // A copy of operator code `code`; false when a field is malformed (every
  // field is read through the verifier).
  bool CopyCode(FlatBufferBuilder& fbb, const Table* code, Offset<Table>* out) {
    std::string name;
    bool has_name = false;
    int8_t deprecated = 0;
    int32_t version = 1, builtin = 0;
    if (!reader_.StringOf(code, kCodeCustomCode, &name, &has_name) ||
        !reader_.Scalar(code, kCodeDeprecatedBuiltin, &deprecated) ||
        !reader_.Scalar(code, kCodeVersion, &version) ||
        !reader_.Scalar(code, kCodeBuiltin, &builtin)) {
      return false;
    }
    Offset<flatbuffers::String> s;
    if (has_name) s = fbb.CreateString(name);
    const uoffset_t start = fbb.StartTable();
    if (HasField(code, kCodeDeprecatedBuiltin)) {
      fbb.AddElement<int8_t>(kCodeDeprecatedBuiltin, deprecated);
    }
    if (has_name) fbb.AddOffset(kCodeCustomCode, s);
    if (HasField(code, kCodeVersion)) fbb.AddElement<int32_t>(kCodeVersion, version);
    if (HasField(code, kCodeBuiltin)) fbb.AddElement<int32_t>(kCodeBuiltin, builtin);
    *out = Offset<Table>(fbb.EndTable(start));
    return true;
  }

  static Offset<Table> NewCode(FlatBufferBuilder& fbb, const std::string& name,
                               int32_t version) {
    const auto s = fbb.CreateString(name);
    const uoffset_t start = fbb.StartTable();
    fbb.AddElement<int8_t>(kCodeDeprecatedBuiltin, kBuiltinCustom);
    fbb.AddOffset(kCodeCustomCode, s);
    fbb.AddElement<int32_t>(kCodeVersion, version);
    fbb.AddElement<int32_t>(kCodeBuiltin, kBuiltinCustom);
    return Offset<Table>(fbb.EndTable(start));
  }

  // A copy of operator `op` reading operator code `opcode`.
  Offset<Table> CopyOperator(FlatBufferBuilder& fbb, const Table* op, uint32_t opcode,
                             std::string* problem) {
    if (HasUnknownFields(op, kOperatorFieldCount)) {
      *problem = "has fields this fusekit does not know (a newer schema): update fusekit";
      return 0;
    }
    // Vectors first: a table is built with nothing else in between.
    std::vector<std::pair<voffset_t, uoffset_t>> vectors;
    for (int id = 0; id < kOperatorFieldCount; ++id) {
      const voffset_t f = Field(id);
      if (!HasField(op, f)) continue;
      if (kOperatorFields[id] == Kind::kUnion) {
        *problem = "is a custom op with builtin options, which fusekit does not write";
        return 0;
      }
      if (kOperatorFields[id] == Kind::kInts) {
        const Vector<int32_t>* v = nullptr;
        if (!reader_.VectorOf<int32_t>(op, f, &v) || v == nullptr) {
          *problem = "has a malformed vector";
          return 0;
        }
        vectors.emplace_back(f, fbb.CreateVector(v->data(), v->size()).o);
      } else if (kOperatorFields[id] == Kind::kBytes) {
        const Vector<uint8_t>* v = nullptr;
        if (!reader_.VectorOf<uint8_t>(op, f, &v) || v == nullptr) {
          *problem = "has a malformed vector";
          return 0;
        }
        vectors.emplace_back(f, fbb.CreateVector(v->data(), v->size()).o);
      }
    }
    // Scalars next, each read through the verifier.
    struct Scalar {
      voffset_t field;
      Kind kind;
      uint64_t bits;
    };
    std::vector<Scalar> scalars;
    for (int id = 1; id < kOperatorFieldCount; ++id) {
      const voffset_t f = Field(id);
      const Kind kind = kOperatorFields[id];
      if (!HasField(op, f) || kind == Kind::kInts || kind == Kind::kBytes) continue;
      bool ok = true;
      uint64_t bits = 0;
      if (kind == Kind::kU8 || kind == Kind::kI8) {
        uint8_t v = 0;
        ok = reader_.Scalar(op, f, &v);
        bits = v;
      } else if (kind == Kind::kI32 || kind == Kind::kU32) {
        uint32_t v = 0;
        ok = reader_.Scalar(op, f, &v);
        bits = v;
      } else {
        ok = reader_.Scalar(op, f, &bits);
      }
      if (!ok) {
        *problem = "has a malformed field";
        return 0;
      }
      scalars.push_back(Scalar{f, kind, bits});
    }
    const uoffset_t start = fbb.StartTable();
    fbb.AddElement<uint32_t>(kOperatorOpcodeIndex, opcode);
    for (const auto& [field, offset] : vectors) fbb.AddOffset(field, Offset<void>(offset));
    for (const Scalar& v : scalars) {
      switch (v.kind) {
        case Kind::kU8:
        case Kind::kI8:
          fbb.AddElement<uint8_t>(v.field, static_cast<uint8_t>(v.bits));
          break;
        case Kind::kI32:
        case Kind::kU32:
          fbb.AddElement<uint32_t>(v.field, static_cast<uint32_t>(v.bits));
          break;
        default:  // kU64, kPosition (moved once the region is placed)
          fbb.AddElement<uint64_t>(v.field, v.bits);
          break;
      }
    }
    return Offset<Table>(fbb.EndTable(start));
  }

  const uint8_t* data_;
  size_t size_;
  TfliteReader reader_;
  const Table* model_ = nullptr;
  const Tables* codes_ = nullptr;
  const Tables* subgraphs_ = nullptr;
  const Tables* buffers_ = nullptr;
  size_t end_ = 0;
};

}  // namespace

NodeCodedModel GiveNodesOwnCodes(const uint8_t* data, size_t size,
                                 const std::function<bool(const std::string&)>& serves) {
  if (data == nullptr || size < 8) {
    NodeCodedModel out;
    out.error = "the model is not a valid .tflite flatbuffer (too small)";
    return out;
  }
  return Rewriter(data, size).Run(serves);
}

}  // namespace fusekit
