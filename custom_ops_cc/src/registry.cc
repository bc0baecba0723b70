// The kernel registry: one KernelDef per op name holding its dtype variants,
// and the schema each kernel exports (plugin_info.cc) as JSON.
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

// {"name", "inputs": [{"name", "optional"}], "outputs": [{"name"}],
//  "attrs": [{"name", "type", "required", "default"}],
//  "signatures": [{"inputs": [dtype...], "outputs": [dtype...]}]}
std::string SchemaJson(const KernelDef& def) {
  std::string j = "{\"name\":" + Quote(def.name) + ",\"inputs\":[";
  const auto& optional = def.variants.front().input_optional;
  for (size_t i = 0; i < def.input_names.size(); ++i) {
    j += (i ? "," : "");
    j += "{\"name\":" + Quote(def.input_names[i]) +
         ",\"optional\":" + (optional[i] ? "true" : "false") + "}";
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
    if (a.required) j.replace(j.rfind("\"default\":"), std::string::npos, "\"default\":null");
    j += "}";
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
        a[i].required != b[i].required) {
      return false;
    }
  }
  return true;
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
                     std::vector<AttrSpec> attrs, KernelVariant variant) {
  const std::string op = name ? name : "";
  if (op.empty()) {
    AddRegistryError("a kernel is registered with an empty name");
    return;
  }
  if (inputs.names.size() != variant.input_types.size() ||
      outputs.names.size() != variant.output_types.size()) {
    AddRegistryError(op + ": " + std::to_string(inputs.names.size()) + " input and " +
                     std::to_string(outputs.names.size()) +
                     " output names registered, but Invoke takes " +
                     std::to_string(variant.input_types.size()) + " inputs and " +
                     std::to_string(variant.output_types.size()) + " outputs");
    return;
  }
  for (size_t i = 1; i < variant.input_optional.size(); ++i) {
    if (variant.input_optional[i - 1] && !variant.input_optional[i]) {
      AddRegistryError(op + ": required input '" + inputs.names[i] +
                       "' follows an optional one");
      return;
    }
  }
  for (KernelDef& def : KernelRegistry()) {
    if (def.name != op) continue;
    if (def.input_names != inputs.names || def.output_names != outputs.names ||
        !SameAttrs(def.attrs, attrs) ||
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
  def.input_names = inputs.names;
  def.output_names = outputs.names;
  def.attrs = std::move(attrs);
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
