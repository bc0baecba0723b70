// Attrs: a node's flexbuffer custom options, validated against the kernel's
// declared attr schema.
#include <cmath>
#include <cstdio>
#include <string>

#include "flatbuffers/flexbuffers.h"
#include "fusekit/kernel_sdk.h"

namespace fusekit {

const char* AttrTypeName(AttrType type) {
  switch (type) {
    case AttrType::kInt: return "int";
    case AttrType::kFloat: return "float";
    case AttrType::kBool: return "bool";
    case AttrType::kString: return "string";
    case AttrType::kInts: return "list of int";
    case AttrType::kFloats: return "list of float";
    case AttrType::kBools: return "list of bool";
    case AttrType::kStrings: return "list of string";
  }
  return "?";
}

Attrs::Attrs(const void* data, size_t size) {
  if (data == nullptr || size == 0) {
    // No options at all: an op without attrs.  Every getter returns defaults.
    valid_ = true;
    return;
  }
  buffer_.assign(static_cast<const uint8_t*>(data),
                 static_cast<const uint8_t*>(data) + size);
  if (!flexbuffers::VerifyBuffer(buffer_.data(), buffer_.size())) {
    error_ = "custom options are not a valid flexbuffer";
    return;
  }
  if (!flexbuffers::GetRoot(buffer_.data(), buffer_.size()).IsMap()) {
    error_ = "custom options are not a flexbuffer map";
    return;
  }
  valid_ = true;
}

namespace {

flexbuffers::Reference Lookup(const std::vector<uint8_t>& buffer, const char* key) {
  if (buffer.empty()) return flexbuffers::Reference();
  return flexbuffers::GetRoot(buffer.data(), buffer.size()).AsMap()[key];
}

bool IsInt(const flexbuffers::Reference& r) { return r.IsInt() || r.IsUInt(); }
// The TF converter writes bools as integers 0/1.
bool IsBoolish(const flexbuffers::Reference& r) { return r.IsBool() || IsInt(r); }
bool IsNumber(const flexbuffers::Reference& r) { return r.IsNumeric() || r.IsBool(); }
bool IsText(const flexbuffers::Reference& r) { return r.IsString() || r.IsBlob(); }

// What a flexbuffer value is, for messages.
std::string Describe(const flexbuffers::Reference& r) {
  if (r.IsBool()) return "bool";
  if (IsInt(r)) return "int";
  if (r.IsFloat()) return "float";
  if (r.IsString()) return "string";
  if (r.IsBlob()) return "blob";
  if (r.IsMap()) return "map";
  if (r.IsTypedVector() || r.IsFixedTypedVector() || r.IsVector()) return "list";
  return "a value of flexbuffer type " + std::to_string(static_cast<int>(r.GetType()));
}

// Lists arrive as typed vectors (numbers, bools) or untyped vectors
// (strings); flexbuffers reads each kind through its own accessor.
template <typename Fn>
bool ForEachElement(const flexbuffers::Reference& r, Fn fn) {
  if (r.IsTypedVector()) {
    auto v = r.AsTypedVector();
    for (size_t i = 0; i < v.size(); ++i) if (!fn(i, v[i])) return false;
    return true;
  }
  if (r.IsFixedTypedVector()) {
    auto v = r.AsFixedTypedVector();
    for (size_t i = 0; i < v.size(); ++i) if (!fn(i, v[i])) return false;
    return true;
  }
  if (r.IsVector()) {
    auto v = r.AsVector();
    for (size_t i = 0; i < v.size(); ++i) if (!fn(i, v[i])) return false;
    return true;
  }
  return false;
}

bool IsList(const flexbuffers::Reference& r) {
  return r.IsTypedVector() || r.IsFixedTypedVector() || r.IsVector();
}

// Does value r fit a declared attr type?  Sets *why when not.
bool Fits(const flexbuffers::Reference& r, AttrType type, std::string* why) {
  bool (*element)(const flexbuffers::Reference&) = nullptr;
  switch (type) {
    case AttrType::kInt: if (IsInt(r) || r.IsBool()) return true; break;
    case AttrType::kFloat: if (IsNumber(r)) return true; break;
    case AttrType::kBool: if (IsBoolish(r)) return true; break;
    case AttrType::kString: if (IsText(r)) return true; break;
    case AttrType::kInts: element = IsInt; break;
    case AttrType::kFloats: element = IsNumber; break;
    case AttrType::kBools: element = IsBoolish; break;
    case AttrType::kStrings: element = IsText; break;
  }
  if (element != nullptr && IsList(r)) {
    std::string bad;
    const bool ok = ForEachElement(r, [&](size_t i, const flexbuffers::Reference& e) {
      if (element(e)) return true;
      bad = "element " + std::to_string(i) + " is " + Describe(e);
      return false;
    });
    if (ok) return true;
    *why = bad;
    return false;
  }
  *why = "got " + Describe(r);
  return false;
}

std::string Shown(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", v);
  return text;
}

// Is a number attr finite (floats) and within its declared range?  Sets
// *why ("a finite number >= 0, got -1") when not.
bool InRange(const AttrSpec& spec, const flexbuffers::Reference& r, std::string* why) {
  if (spec.type != AttrType::kInt && spec.type != AttrType::kFloat) return true;
  const double v = spec.type == AttrType::kInt ? static_cast<double>(r.AsInt64()) : r.AsDouble();
  const bool is_float = spec.type == AttrType::kFloat;
  if ((!is_float || std::isfinite(v)) && v >= spec.min && v <= spec.max) return true;
  std::string want = is_float ? "a finite number" : "an int";
  if (!std::isinf(spec.min)) want += " >= " + Shown(spec.min);
  if (!std::isinf(spec.max)) want += std::string(std::isinf(spec.min) ? "" : " and") + " <= " + Shown(spec.max);
  *why = want + ", got " + Shown(v);
  return false;
}

}  // namespace

bool Attrs::Validate(const std::vector<AttrSpec>* schema) {
  schema_ = schema;
  if (!valid_) return false;
  for (const AttrSpec& spec : *schema) {
    const auto r = Lookup(buffer_, spec.name);
    if (r.IsNull()) {
      if (spec.required) {
        error_ = std::string("required attr '") + spec.name + "' (" +
                 AttrTypeName(spec.type) + ") is missing";
        return false;
      }
      continue;
    }
    std::string why;
    if (!Fits(r, spec.type, &why)) {
      error_ = std::string("attr '") + spec.name + "' must be " +
               AttrTypeName(spec.type) + ", " + why;
      return false;
    }
    if (!InRange(spec, r, &why)) {
      error_ = std::string("attr '") + spec.name + "' must be " + why;
      return false;
    }
  }
  const auto version = Lookup(buffer_, kOptionsVersionKey);
  if (!version.IsNull() && !IsInt(version)) {
    error_ = std::string("'") + kOptionsVersionKey + "' must be int, got " + Describe(version);
    return false;
  }
  return true;
}

int64_t Attrs::FormatVersion() const {
  const auto r = valid_ ? Lookup(buffer_, kOptionsVersionKey) : flexbuffers::Reference();
  return IsInt(r) ? r.AsInt64() : 1;
}

bool Attrs::LegacyBool(const char* key, bool fallback, std::string* error) const {
  const auto r = valid_ ? Lookup(buffer_, key) : flexbuffers::Reference();
  if (IsBoolish(r)) return r.AsInt64() != 0;
  if (!r.IsNull() && error != nullptr) {
    *error = std::string("attr '") + key + "' must be bool, got " + Describe(r);
  }
  return fallback;
}

bool Attrs::Has(const char* key) const {
  CheckDeclared(key);
  return valid_ && !Lookup(buffer_, key).IsNull();
}

std::vector<std::string> Attrs::Keys() const {
  std::vector<std::string> keys;
  if (!valid_ || buffer_.empty()) return keys;
  auto map_keys = flexbuffers::GetRoot(buffer_.data(), buffer_.size()).AsMap().Keys();
  for (size_t i = 0; i < map_keys.size(); ++i) keys.push_back(map_keys[i].AsKey());
  return keys;
}

const AttrSpec* Attrs::Spec(const char* key) const {
  if (schema_ == nullptr) return nullptr;
  for (const AttrSpec& spec : *schema_) {
    if (std::string(spec.name) == key) return &spec;
  }
  return nullptr;
}

void Attrs::CheckDeclared(const char* key) const {
  if (schema_ == nullptr || Spec(key) != nullptr || !undeclared_.empty()) return;
  std::string declared;
  for (const AttrSpec& spec : *schema_) {
    declared += (declared.empty() ? "" : ", ") + std::string(spec.name);
  }
  undeclared_ = std::string("the kernel reads attr '") + key +
                "', which its schema does not declare (declared: " +
                (declared.empty() ? "none" : declared) +
                "); add it to the kernel's AttrSchema or fix the name";
}

// The getters read values Validate accepted, else the declared default; a
// key the schema does not declare is recorded (undeclared()) and reads as
// the type's zero until the SDK fails the node.

double Attrs::Float(const char* key) const {
  CheckDeclared(key);
  const auto r = valid_ ? Lookup(buffer_, key) : flexbuffers::Reference();
  if (!r.IsNull() && IsNumber(r)) return r.AsDouble();
  const AttrSpec* spec = Spec(key);
  return spec ? spec->number_default : 0.0;
}

int64_t Attrs::Int(const char* key) const {
  CheckDeclared(key);
  const auto r = valid_ ? Lookup(buffer_, key) : flexbuffers::Reference();
  if (!r.IsNull() && IsBoolish(r)) return r.AsInt64();
  const AttrSpec* spec = Spec(key);
  return spec ? static_cast<int64_t>(spec->number_default) : 0;
}

bool Attrs::Bool(const char* key) const {
  CheckDeclared(key);
  const auto r = valid_ ? Lookup(buffer_, key) : flexbuffers::Reference();
  if (!r.IsNull() && IsBoolish(r)) return r.AsInt64() != 0;
  const AttrSpec* spec = Spec(key);
  return spec ? spec->number_default != 0.0 : false;
}

std::string Attrs::String(const char* key) const {
  CheckDeclared(key);
  const auto r = valid_ ? Lookup(buffer_, key) : flexbuffers::Reference();
  if (r.IsString()) return r.AsString().str();
  if (r.IsBlob()) {
    auto b = r.AsBlob();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  const AttrSpec* spec = Spec(key);
  return spec && spec->string_default ? spec->string_default : "";
}

namespace {
template <typename T, typename Convert>
std::vector<T> ReadList(const std::vector<uint8_t>& buffer, bool valid, const char* key,
                        bool (*accept)(const flexbuffers::Reference&), Convert convert) {
  std::vector<T> out;
  if (!valid) return out;
  const auto r = Lookup(buffer, key);
  const bool ok = ForEachElement(r, [&](size_t, const flexbuffers::Reference& e) {
    if (!accept(e)) return false;
    out.push_back(convert(e));
    return true;
  });
  if (!ok) out.clear();
  return out;
}
}  // namespace

std::vector<int64_t> Attrs::Ints(const char* key) const {
  CheckDeclared(key);
  return ReadList<int64_t>(buffer_, valid_, key, IsInt,
                           [](const flexbuffers::Reference& e) { return e.AsInt64(); });
}
std::vector<double> Attrs::Floats(const char* key) const {
  CheckDeclared(key);
  return ReadList<double>(buffer_, valid_, key, IsNumber,
                          [](const flexbuffers::Reference& e) { return e.AsDouble(); });
}
std::vector<bool> Attrs::Bools(const char* key) const {
  CheckDeclared(key);
  return ReadList<bool>(buffer_, valid_, key, IsBoolish,
                        [](const flexbuffers::Reference& e) { return e.AsInt64() != 0; });
}
std::vector<std::string> Attrs::Strings(const char* key) const {
  CheckDeclared(key);
  return ReadList<std::string>(buffer_, valid_, key, IsText,
                               [](const flexbuffers::Reference& e) {
                                 if (e.IsBlob()) {
                                   auto b = e.AsBlob();
                                   return std::string(
                                       reinterpret_cast<const char*>(b.data()), b.size());
                                 }
                                 return e.AsString().str();
                               });
}

}  // namespace fusekit
