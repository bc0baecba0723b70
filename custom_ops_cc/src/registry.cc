// The kernel registry: one KernelDef per op name holding its dtype variants,
// and the schema each kernel exports (plugin_info.cc) as JSON.
#include <cmath>
#include <cstdio>
#include <string>

#include "fusekit/kernel_sdk.h"

namespace fusekit {

std::vector<KernelDef>& KernelRegistry() {
  // A function-local static: registrars in other translation units run
  // before main in unspecified order.
  static std::vector<KernelDef> registry;
  return registry;
}

namespace {

std::string& MutableRegistryError() {
  static std::string error;
  return error;
}

void AddRegistryError(const std::string& message) {
  std::string& error = MutableRegistryError();
  if (!error.empty()) error += "; ";
  error += message;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// A bound of an attr's range; null when unbounded.
std::string Bound(double v) { return std::isinf(v) ? "null" : Number(v); }

std::vector<std::string> Names(const NameList& list) {
  std::vector<std::string> names;
  for (const OperandSpec& o : list.operands) names.push_back(o.name);
  return names;
}

bool SameOperands(const std::vector<OperandSpec>& a, const std::vector<OperandSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].min_rank != b[i].min_rank ||
        a[i].max_rank != b[i].max_rank || a[i].length_of != b[i].length_of ||
        a[i].length_dim != b[i].length_dim || a[i].has_absent_value != b[i].has_absent_value ||
        a[i].absent_value != b[i].absent_value) {
      return false;
    }
  }
  return true;
}

// {"name", "options_version", "v1_presence": [{"input", "attr"}],
//  "inputs": [{"name", "optional", "min_rank", "max_rank",
//              "vector_of": null | {"input", "dim"}, "absent_value": null | number}],
//  "outputs": [{"name"}],
//  "attrs": [{"name", "type", "required", "default", "min", "max"}],
//  "signatures": [{"inputs": [dtype...], "outputs": [dtype...]}]}
// (default null: required, or optional without a default; min/max null:
// unbounded; ranks -1: any.)
std::string SchemaJson(const KernelDef& def) {
  std::string j = "{\"name\":" + Quote(def.name) +
                  ",\"options_version\":" + std::to_string(def.format.version) +
                  ",\"v1_presence\":[";
  for (size_t i = 0; i < def.format.v1_presence.size(); ++i) {
    j += (i ? "," : "");
    j += "{\"input\":" + Quote(def.format.v1_presence[i].first) +
         ",\"attr\":" + Quote(def.format.v1_presence[i].second) + "}";
  }
  j += "],\"inputs\":[";
  const auto& optional = def.variants.front().input_optional;
  for (size_t i = 0; i < def.inputs.size(); ++i) {
    const OperandSpec& in = def.inputs[i];
    j += (i ? "," : "");
    j += "{\"name\":" + Quote(in.name) + ",\"optional\":" +
         (optional[i] ? "true" : "false") + ",\"min_rank\":" + std::to_string(in.min_rank) +
         ",\"max_rank\":" + std::to_string(in.max_rank) + ",\"vector_of\":";
    j += in.length_of.empty() ? "null"
                              : "{\"input\":" + Quote(in.length_of) +
                                    ",\"dim\":" + std::to_string(in.length_dim) + "}";
    j += ",\"absent_value\":";
    j += in.has_absent_value ? Number(in.absent_value) : "null";
    j += "}";
  }
  j += "],\"outputs\":[";
  for (size_t i = 0; i < def.output_names.size(); ++i) {
    j += (i ? "," : "");
    j += "{\"name\":" + Quote(def.output_names[i]) + "}";
  }
  j += "],\"attrs\":[";
  for (size_t i = 0; i < def.attrs.size(); ++i) {
    const AttrSpec& a = def.attrs[i];
    j += (i ? "," : "");
    j += "{\"name\":" + Quote(a.name) + ",\"type\":" + Quote(AttrTypeName(a.type)) +
         ",\"required\":" + (a.required ? "true" : "false") + ",\"default\":";
    switch (a.type) {
      case AttrType::kInt: j += Number(static_cast<double>(static_cast<int64_t>(a.number_default))); break;
      case AttrType::kFloat: j += Number(a.number_default); break;
      case AttrType::kBool: j += a.number_default != 0.0 ? "true" : "false"; break;
      case AttrType::kString: j += Quote(a.string_default ? a.string_default : ""); break;
      default: j += "[]"; break;
    }
    if (!a.has_default) j.replace(j.rfind("\"default\":"), std::string::npos, "\"default\":null");
    j += ",\"min\":" + Bound(a.min) + ",\"max\":" + Bound(a.max) + "}";
  }
  j += "],\"signatures\":[";
  for (size_t v = 0; v < def.variants.size(); ++v) {
    const KernelVariant& var = def.variants[v];
    j += (v ? "," : "");
    j += "{\"inputs\":[";
    for (size_t i = 0; i < var.input_types.size(); ++i) {
      j += (i ? "," : "") + Quote(TypeName(var.input_types[i]));
    }
    j += "],\"outputs\":[";
    for (size_t i = 0; i < var.output_types.size(); ++i) {
      j += (i ? "," : "") + Quote(TypeName(var.output_types[i]));
    }
    j += "]}";
  }
  return j + "]}";
}

bool SameAttrs(const std::vector<AttrSpec>& a, const std::vector<AttrSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::string(a[i].name) != b[i].name || a[i].type != b[i].type ||
        a[i].required != b[i].required || a[i].has_default != b[i].has_default ||
        a[i].min != b[i].min || a[i].max != b[i].max) {
      return false;
    }
  }
  return true;
}

// Why a declaration is inconsistent in itself ("" when it is not).
std::string DeclarationError(const NameList& inputs, const std::vector<AttrSpec>& attrs,
                             const OptionsFormat& format) {
  const std::vector<std::string> names = Names(inputs);
  auto known = [&](const std::string& input) {
    for (const std::string& n : names) {
      if (n == input) return true;
    }
    return false;
  };
  for (const OperandSpec& in : inputs.operands) {
    if (!in.length_of.empty() && !known(in.length_of)) {
      return "input '" + in.name + "' is a vector of input '" + in.length_of +
             "', which is not declared";
    }
  }
  for (const AttrSpec& a : attrs) {
    if (std::string(a.name) == kOptionsVersionKey) {
      return std::string("attr '") + kOptionsVersionKey + "' is reserved for the options format";
    }
    const bool number = a.type == AttrType::kInt || a.type == AttrType::kFloat;
    if (a.has_default && number && !(a.number_default >= a.min && a.number_default <= a.max)) {
      return std::string("the default of attr '") + a.name + "' is outside its range";
    }
  }
  if (format.version < 1) return "options version must be >= 1";
  for (const auto& [input, attr] : format.v1_presence) {
    if (!known(input)) return "version-1 presence of undeclared input '" + input + "'";
  }
  return "";
}

}  // namespace

const std::string& RegistryError() { return MutableRegistryError(); }

const KernelDef* FindKernel(const char* name) {
  if (name == nullptr) return nullptr;
  for (const KernelDef& def : KernelRegistry()) {
    if (def.name == name) return &def;
  }
  return nullptr;
}

void RegisterVariant(const char* name, const NameList& inputs, const NameList& outputs,
                     std::vector<AttrSpec> attrs, KernelVariant variant,
                     OptionsFormat format) {
  const std::string op = name ? name : "";
  if (op.empty()) {
    AddRegistryError("a kernel is registered with an empty name");
    return;
  }
  if (inputs.operands.size() != variant.input_types.size() ||
      outputs.operands.size() != variant.output_types.size()) {
    AddRegistryError(op + ": " + std::to_string(inputs.operands.size()) + " input and " +
                     std::to_string(outputs.operands.size()) +
                     " output names registered, but Invoke takes " +
                     std::to_string(variant.input_types.size()) + " inputs and " +
                     std::to_string(variant.output_types.size()) + " outputs");
    return;
  }
  for (size_t i = 1; i < variant.input_optional.size(); ++i) {
    if (variant.input_optional[i - 1] && !variant.input_optional[i]) {
      AddRegistryError(op + ": required input '" + inputs.operands[i].name +
                       "' follows an optional one");
      return;
    }
  }
  const std::string declaration = DeclarationError(inputs, attrs, format);
  if (!declaration.empty()) {
    AddRegistryError(op + ": " + declaration);
    return;
  }
  for (KernelDef& def : KernelRegistry()) {
    if (def.name != op) continue;
    if (!SameOperands(def.inputs, inputs.operands) || def.output_names != Names(outputs) ||
        !SameAttrs(def.attrs, attrs) || def.format.version != format.version ||
        def.format.v1_presence != format.v1_presence ||
        def.variants.front().input_optional != variant.input_optional) {
      AddRegistryError(op + ": registered twice with different operands or attrs");
      return;
    }
    for (const KernelVariant& v : def.variants) {
      if (v.input_types == variant.input_types && v.output_types == variant.output_types) {
        AddRegistryError(op + ": registered twice with the same dtypes");
        return;
      }
    }
    def.variants.push_back(std::move(variant));
    def.schema_json = SchemaJson(def);
    return;
  }
  KernelDef def;
  def.name = op;
  def.input_names = Names(inputs);
  def.output_names = Names(outputs);
  def.inputs = inputs.operands;
  def.attrs = std::move(attrs);
  def.format = std::move(format);
  int required = 0;
  for (bool optional : variant.input_optional) {
    if (optional) break;
    ++required;
  }
  def.min_inputs = required;
  def.variants.push_back(std::move(variant));
  def.schema_json = SchemaJson(def);
  KernelRegistry().push_back(std::move(def));
}

}  // namespace fusekit
