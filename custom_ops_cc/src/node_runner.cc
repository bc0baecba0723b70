#include "node_runner.h"

#include <cstdio>
#include <string>

namespace fusekit {

void ReportError(TfLiteContext* context, const char* format, ...) {
  char message[768];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  if (context != nullptr && context->ReportError != nullptr) {
    // Runtimes join consecutive reports: end each message with a newline.
    context->ReportError(context, "%s\n", message);
  } else {
    std::fprintf(stderr, "%s\n", message);
  }
}

std::vector<int> IntArrayToVector(const TfLiteIntArray* array) {
  std::vector<int> v;
  if (array != nullptr && array->size > 0) {
    v.assign(array->data, array->data + array->size);
  }
  return v;
}

NodeState::~NodeState() {
  if (kernel != nullptr && variant != nullptr) variant->destroy(kernel);
}

void FreeNodeState(TfLiteContext*, void* state) {
  delete static_cast<NodeState*>(state);
}

std::unique_ptr<NodeState> NewNodeState(const KernelDef* def,
                                        const void* options, size_t size) {
  auto state = std::make_unique<NodeState>();
  state->def = def;
  state->attrs = Attrs(options, size);
  if (!state->attrs.valid()) {
    state->create_error = "malformed custom options (" +
                          state->attrs.error() + ", " + std::to_string(size) +
                          " bytes)";
  } else if (!state->attrs.Validate(&def->attrs)) {
    state->create_error = state->attrs.error();
  } else {
    const int64_t version = state->attrs.FormatVersion();
    if (version < 1 || version > def->format.version) {
      state->create_error = "custom options of format version " + std::to_string(version) +
                            "; this kernel reads versions 1 to " +
                            std::to_string(def->format.version) +
                            " (a model written by a newer fusekit?)";
    } else if (version == 1 && !def->format.v1_presence.empty()) {
      int packed = 0;
      for (const std::string& name : def->input_names) {
        bool present = true;
        for (const auto& [input, attr] : def->format.v1_presence) {
          if (input == name) {
            present = state->attrs.LegacyBool(attr.c_str(), true, &state->create_error);
          }
        }
        state->v1_layout.push_back(present ? packed++ : -1);
      }
    }
  }
  return state;
}

namespace {

// Version-1 nodes listed only the optional inputs they had: put each at its
// position, absent ones as -1.  False (with *error) when the node's input
// count is not what its attrs announce.
bool MapV1Inputs(const KernelDef& def, NodeState* state, std::string* error) {
  if (state->v1_layout.empty() || state->inputs == state->mapped_inputs) return true;
  int packed = 0;
  std::string announced;
  for (size_t i = 0; i < state->v1_layout.size(); ++i) {
    if (state->v1_layout[i] < 0) continue;
    ++packed;
    announced += (announced.empty() ? "" : ", ") + def.input_names[i];
  }
  if (static_cast<int>(state->inputs.size()) != packed) {
    std::string flags;
    for (const auto& [input, attr] : def.format.v1_presence) {
      flags += " " + attr + "=" + (state->attrs.LegacyBool(attr.c_str(), true) ? "1" : "0");
    }
    *error = "expected " + std::to_string(packed) + " inputs (" + announced +
             ", from the version-1 attrs" + flags + "), got " +
             std::to_string(state->inputs.size());
    return false;
  }
  std::vector<int> mapped;
  for (int position : state->v1_layout) {
    mapped.push_back(position < 0 ? -1 : state->inputs[position]);
  }
  state->inputs = mapped;
  state->mapped_inputs = std::move(mapped);
  return true;
}

// The shape rules the schema declares for each present input.
bool CheckShapeRules(TfLiteContext* context, const KernelDef& def, const NodeState& state,
                     std::string* error) {
  auto view = [&](size_t i) {
    return i < state.inputs.size() && state.inputs[i] >= 0
               ? Tensor(&context->tensors[state.inputs[i]], static_cast<int>(i))
               : Tensor(nullptr, static_cast<int>(i));
  };
  for (size_t i = 0; i < def.inputs.size(); ++i) {
    const OperandSpec& rule = def.inputs[i];
    const Tensor t = view(i);
    if (!t.present()) continue;
    const bool low = rule.min_rank >= 0 && t.rank() < rule.min_rank;
    const bool high = rule.max_rank >= 0 && t.rank() > rule.max_rank;
    if (low || high) {
      std::string want;
      if (rule.max_rank < 0) {
        want = ">= " + std::to_string(rule.min_rank);
      } else if (rule.min_rank < 0) {
        want = "<= " + std::to_string(rule.max_rank);
      } else if (rule.min_rank == rule.max_rank) {
        want = std::to_string(rule.min_rank);
      } else {
        want = std::to_string(rule.min_rank) + " to " + std::to_string(rule.max_rank);
      }
      *error = "input " + rule.name + " must have rank " + want + ", got rank " +
               std::to_string(t.rank());
      return false;
    }
    if (rule.length_of.empty()) continue;
    size_t of = 0;
    while (def.input_names[of] != rule.length_of) ++of;  // the registry checked it exists
    const Tensor base = view(of);
    const int length = base.dim(rule.length_dim);
    if (!base.present() || (t.rank() == 1 && t.dim(0) == length)) continue;
    const std::string where = rule.length_dim == -1
                                  ? rule.length_of + "'s last dim"
                                  : "dim " + std::to_string(rule.length_dim) + " of " +
                                        rule.length_of;
    *error = rule.name + " must be a vector of length " + std::to_string(length) + " (" +
             where + "), got " + std::to_string(t.num_elements()) + " elements in rank " +
             std::to_string(t.rank());
    return false;
  }
  return true;
}

}  // namespace

namespace {

std::string Signature(const KernelVariant& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.input_types.size(); ++i) {
    if (i) s += ", ";
    s += TypeName(v.input_types[i]);
  }
  s += " -> ";
  for (size_t i = 0; i < v.output_types.size(); ++i) {
    if (i) s += ", ";
    s += TypeName(v.output_types[i]);
  }
  return s + ")";
}

// Index, presence and shape of one operand; the message names the operand.
bool CheckOperand(TfLiteContext* context, const KernelDef& def,
                  const char* kind, size_t position, int index, bool optional,
                  std::string* error) {
  const std::string& name =
      kind[0] == 'i' ? def.input_names[position] : def.output_names[position];
  if (index < 0) {
    if (optional) return true;
    *error = std::string(kind) + " '" + name + "' is missing (tensor index " +
             std::to_string(index) + ")";
    return false;
  }
  if (static_cast<size_t>(index) >= context->tensors_size) {
    *error = std::string(kind) + " '" + name + "': tensor index " +
             std::to_string(index) + " out of range (the graph has " +
             std::to_string(context->tensors_size) + " tensors)";
    return false;
  }
  const Tensor t(&context->tensors[index], static_cast<int>(position));
  if (t.num_elements() < 0) {
    std::string dims;
    for (int d : t.shape()) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    *error = std::string(kind) + " '" + name + "' has an invalid shape [" +
             dims + "] (a negative dim or more elements than fit in int64)";
    return false;
  }
  return true;
}

const KernelVariant* ChooseVariant(TfLiteContext* context, const KernelDef& def,
                                   const NodeState& state, std::string* error) {
  auto type_of = [&](int index) { return context->tensors[index].type; };
  for (const KernelVariant& v : def.variants) {
    bool match = true;
    for (size_t i = 0; i < state.inputs.size() && match; ++i) {
      if (state.inputs[i] >= 0 && type_of(state.inputs[i]) != v.input_types[i]) {
        match = false;
      }
    }
    for (size_t i = 0; i < state.outputs.size() && match; ++i) {
      if (type_of(state.outputs[i]) != v.output_types[i]) match = false;
    }
    if (match) return &v;
  }
  // Name the first operand whose dtype no variant accepts; otherwise the
  // combination is what is unsupported.
  auto explain = [&](const char* kind, const std::vector<int>& indices,
                     const std::vector<std::string>& names,
                     std::vector<TfLiteType> KernelVariant::*types) {
    for (size_t i = 0; i < indices.size(); ++i) {
      if (indices[i] < 0) continue;
      std::string accepted;
      bool ok = false;
      for (const KernelVariant& v : def.variants) {
        const TfLiteType t = (v.*types)[i];
        ok = ok || t == type_of(indices[i]);
        const std::string tn = TypeName(t);
        if (accepted.find(tn) == std::string::npos) {
          accepted += (accepted.empty() ? "" : " or ") + tn;
        }
      }
      if (!ok) {
        *error = std::string(kind) + " '" + names[i] + "' must be " + accepted +
                 ", got " + TypeName(type_of(indices[i]));
        return true;
      }
    }
    return false;
  };
  if (explain("input", state.inputs, def.input_names, &KernelVariant::input_types) ||
      explain("output", state.outputs, def.output_names, &KernelVariant::output_types)) {
    return nullptr;
  }
  std::string have;
  for (size_t i = 0; i < state.inputs.size(); ++i) {
    if (state.inputs[i] < 0) continue;
    have += (have.empty() ? "" : ", ") + def.input_names[i] + "=" +
            TypeName(type_of(state.inputs[i]));
  }
  std::string known;
  for (const KernelVariant& v : def.variants) {
    known += (known.empty() ? "" : ", ") + Signature(v);
  }
  *error = "input dtypes " + have + " match none of the kernel's signatures " + known;
  return nullptr;
}

}  // namespace

TfLiteStatus PrepareNode(TfLiteContext* context, NodeState* state) {
  if (state == nullptr) {
    ReportError(context, "fusekit: node has no state (kernel init failed)");
    return kTfLiteError;
  }
  const KernelDef& def = *state->def;
  const char* op = def.name.c_str();
  if (!RegistryError().empty()) {
    ReportError(context, "%s: %s", op, RegistryError().c_str());
    return kTfLiteError;
  }
  if (!state->create_error.empty()) {
    ReportError(context, "%s: %s", op, state->create_error.c_str());
    return kTfLiteError;
  }
  std::string error;
  if (!MapV1Inputs(def, state, &error)) {
    ReportError(context, "%s: %s", op, error.c_str());
    return kTfLiteError;
  }
  const int max_in = static_cast<int>(def.input_names.size());
  const int n_in = static_cast<int>(state->inputs.size());
  if (n_in < def.min_inputs || n_in > max_in) {
    if (def.min_inputs == max_in) {
      ReportError(context, "%s: expected %d inputs, got %d", op, max_in, n_in);
    } else {
      ReportError(context, "%s: expected %d to %d inputs, got %d", op,
                  def.min_inputs, max_in, n_in);
    }
    return kTfLiteError;
  }
  const int n_out = static_cast<int>(state->outputs.size());
  if (n_out != static_cast<int>(def.output_names.size())) {
    ReportError(context, "%s: expected %zu outputs, got %d", op,
                def.output_names.size(), n_out);
    return kTfLiteError;
  }
  const std::vector<bool>& optional = def.variants.front().input_optional;
  for (int i = 0; i < n_in; ++i) {
    if (!CheckOperand(context, def, "input", i, state->inputs[i], optional[i], &error)) {
      ReportError(context, "%s: %s", op, error.c_str());
      return kTfLiteError;
    }
  }
  for (int i = 0; i < n_out; ++i) {
    if (!CheckOperand(context, def, "output", i, state->outputs[i], false, &error)) {
      ReportError(context, "%s: %s", op, error.c_str());
      return kTfLiteError;
    }
  }
  const KernelVariant* variant = ChooseVariant(context, def, *state, &error);
  if (variant == nullptr || !CheckShapeRules(context, def, *state, &error)) {
    ReportError(context, "%s: %s", op, error.c_str());
    return kTfLiteError;
  }
  if (variant != state->variant || state->kernel == nullptr) {
    if (state->kernel != nullptr) state->variant->destroy(state->kernel);
    state->kernel = nullptr;
    state->variant = variant;
    std::string create_error;
    state->kernel = variant->create(state->attrs, &create_error);
    if (state->kernel == nullptr) {
      ReportError(context, "%s: %s", op,
                  create_error.empty() ? "kernel creation failed" : create_error.c_str());
      return kTfLiteError;
    }
  }
  if (!state->resources) state->resources = ResourcesFor(context);
  // Threads start here, once, not in the first Invoke.
  if (state->resources->num_threads > 1) state->resources->Pool();
  state->output_override.assign(state->outputs.size(), nullptr);
  // A view from an earlier Prepare becomes an ordinary tensor again until
  // the kernel asks anew (the runtime resizes only tensors it plans).
  for (size_t i = 0; i < state->alias_input.size() && i < state->outputs.size(); ++i) {
    if (state->alias_input[i] >= 0) {
      context->tensors[state->outputs[i]].allocation_type = kTfLiteArenaRw;
    }
  }
  state->alias_input.assign(state->outputs.size(), -1);
  state->alias_offset.assign(state->outputs.size(), 0);
  OpContext ctx(context, state);
  const TfLiteStatus status = variant->prepare(state->kernel, ctx);
  if (status != kTfLiteOk) return status;
  for (size_t i = 0; i < state->outputs.size(); ++i) {
    if (state->alias_input[i] < 0) continue;
    // The arena planner allocates only kTfLiteArenaRw tensors: a custom
    // one gets no memory of its own, and InvokeNode points it at its input.
    // Until then it has none (a read before the first Invoke is refused by
    // the runtime instead of reading a stale pointer).
    TfLiteTensor& t = context->tensors[state->outputs[i]];
    t.allocation_type = kTfLiteCustom;
    FusekitSetTensorData(&t, nullptr);
  }
  return kTfLiteOk;
}

TfLiteStatus InvokeNode(TfLiteContext* context, NodeState* state) {
  if (state == nullptr || state->kernel == nullptr || !state->resources) {
    ReportError(context, "%s: invoked before a successful prepare",
                state && state->def ? state->def->name.c_str() : "fusekit");
    return kTfLiteError;
  }
  const char* op = state->def->name.c_str();
  // Every tensor the kernel touches must have memory for its shape: a
  // malformed graph (two ops writing one tensor, an unallocated input)
  // would otherwise send the kernel through a null or short buffer.
  for (size_t i = 0; i < state->inputs.size(); ++i) {
    if (state->inputs[i] < 0) continue;
    const TfLiteTensor& t = context->tensors[state->inputs[i]];
    const int64_t n = Tensor(const_cast<TfLiteTensor*>(&t), 0).num_elements();
    const size_t need = static_cast<size_t>(n < 0 ? 0 : n) * TypeSize(t.type);
    if (n < 0 || (need > 0 && (FusekitTensorData(&t) == nullptr || t.bytes < need))) {
      ReportError(context,
                  "%s: input '%s' (tensor %d, %s) has %s for its shape (%zu bytes "
                  "needed, %zu present)",
                  op, state->def->input_names[i].c_str(), state->inputs[i],
                  t.name ? t.name : "?",
                  FusekitTensorData(&t) == nullptr ? "no memory" : "too little memory",
                  need, t.bytes);
      return kTfLiteError;
    }
  }
  size_t sink_bytes = 0;
  std::vector<size_t> sink_offset(state->outputs.size(), SIZE_MAX);
  for (size_t i = 0; i < state->outputs.size(); ++i) {
    TfLiteTensor& t = context->tensors[state->outputs[i]];
    const int64_t n = Tensor(&t, 0).num_elements();
    if (n < 0) {
      ReportError(context, "%s: output '%s' has an invalid shape", op,
                  state->def->output_names[i].c_str());
      return kTfLiteError;
    }
    const size_t need = static_cast<size_t>(n) * TypeSize(t.type);
    const int alias = i < state->alias_input.size() ? state->alias_input[i] : -1;
    if (alias >= 0) {
      // A view of an input: re-pointed every Invoke, since the runtime may
      // have moved the input's buffer (a resize, a new allocation).
      const int source = state->inputs[alias];
      const TfLiteTensor& in = context->tensors[source];
      const size_t offset = state->alias_offset[i];
      if (FusekitTensorData(&in) == nullptr || offset > in.bytes || in.bytes - offset < need) {
        ReportError(context,
                    "%s: output '%s' views input '%s' from byte %zu on, %zu bytes, but "
                    "the input has %zu bytes",
                    op, state->def->output_names[i].c_str(),
                    state->def->input_names[alias].c_str(), offset, need, in.bytes);
        return kTfLiteError;
      }
      FusekitSetTensorData(&t, static_cast<uint8_t*>(FusekitTensorData(&in)) + offset);
      continue;
    }
    const bool unread = i < state->output_unread.size() && state->output_unread[i];
    if (unread || FusekitTensorData(&t) == nullptr) {
      // Nothing reads this output (the runtime allocates only what is
      // read): the kernel writes it into the shared sink.
      sink_offset[i] = sink_bytes;
      sink_bytes += (need + 63) & ~size_t{63};
    } else if (t.bytes < need) {
      ReportError(context,
                  "%s: output '%s' (tensor %d) has %zu bytes, its shape needs %zu",
                  op, state->def->output_names[i].c_str(), state->outputs[i], t.bytes,
                  need);
      return kTfLiteError;
    }
  }
  state->output_override.assign(state->outputs.size(), nullptr);
  if (sink_bytes > 0) {
    auto* sink = static_cast<uint8_t*>(state->resources->sink.Get(sink_bytes));
    if (sink == nullptr) {
      ReportError(context, "%s: out of memory (%zu bytes for unread outputs)", op,
                  sink_bytes);
      return kTfLiteError;
    }
    for (size_t i = 0; i < sink_offset.size(); ++i) {
      if (sink_offset[i] != SIZE_MAX) state->output_override[i] = sink + sink_offset[i];
    }
  }
  OpContext ctx(context, state);
  return state->variant->invoke(state->kernel, ctx);
}

}  // namespace fusekit
