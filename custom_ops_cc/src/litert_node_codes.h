// Every fused node its own custom code, so that LiteRT's CompiledModel calls
// one kernel entry per node (see litert_adapter.cc for why).
#ifndef FUSEKIT_SRC_LITERT_NODE_CODES_H_
#define FUSEKIT_SRC_LITERT_NODE_CODES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fusekit {

// One custom-op node that got a code of its own.
struct CodedNode {
  std::string op;    // the op's real name (the kernel's)
  std::string code;  // the custom code the node has in the rewritten model
  uint32_t subgraph = 0;
  uint32_t op_index = 0;
  int32_t version = 1;  // the operator code's
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A model in memory LiteRT may read in place: 64-byte aligned, owned.
struct NodeCodedModel {
  std::unique_ptr<uint8_t, FreeDeleter> data;
  size_t size = 0;
  std::vector<CodedNode> nodes;
  std::string error;  // non-empty: nothing else is set
};

// A copy of the .tflite at `data` in which every operator whose custom code
// `serves` accepts has a custom code of its own, "<op>@s<subgraph>.op<index>"
// (new operator codes and operator tables are written in a region placed
// after the flatbuffer, before any weights stored past it, whose offsets
// move by the region's size; every other byte is kept).  Refuses (error set)
// a malformed model and an operator with fields this reader does not know.
NodeCodedModel GiveNodesOwnCodes(const uint8_t* data, size_t size,
                                 const std::function<bool(const std::string&)>& serves);

}  // namespace fusekit

#endif  // FUSEKIT_SRC_LITERT_NODE_CODES_H_
