"""Tensors named by index from inside other tensors' quantization details.

Most index-bearing fields of the TFLite schema sit in the subgraph's wiring
(operator inputs, outputs and intermediates, subgraph inputs and outputs,
signature maps), which ``graph.Graph`` renumbers itself.  Two quantization
detail tables name tensors of the same subgraph as well:

* ``BlockwiseQuantization.scales`` / ``zero_points`` (ai-edge-quantizer's
  blockwise int4/int2/int8 weights: a FLOAT16 scale tensor ``[rows,
  cols / block]``),
* ``MultiAxisQuantization.scales`` / ``zero_points``,

with -1 for "none".  No operator reads those tensors, so a rewrite that
drops or renumbers "unused" tensors orphans them, and the runtimes follow
the stale index without checking it (a segfault at the first invoke).

A rewrite works on the schema's object API, where such a reference is a
plain int that means nothing once tensors move, are copied into another
subgraph (inlining a composite) or dropped.  So ``link`` turns each of them
into a reference to the tensor *object*, kept beside the int, and
``resolve`` writes the ints back from the objects before the model is
packed (and before anything counts which tensors or buffers are used):
whatever list the tensor ended up in, and however it was copied, the
reference follows it; a named tensor missing from its subgraph is added
to it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

from ai_edge_litert import schema_py_generated as schema

#: Detail table -> fields holding a tensor index of the same subgraph.
TENSOR_FIELDS: dict[type, tuple[str, ...]] = {
    schema.BlockwiseQuantizationT: ("scales", "zeroPoints"),
    schema.MultiAxisQuantizationT: ("scales", "zeroPoints"),
}

# Attribute of a details object holding {field: TensorT} while linked.
_LINKS = "_fusekit_tensor_links"


def _details(tensor: schema.TensorT) -> object | None:
    q = tensor.quantization
    if q is None or type(q.details) not in TENSOR_FIELDS:
        return None
    return q.details


def named_indices(tensor: schema.TensorT) -> list[int]:
    """The tensor indices ``tensor``'s quantization details name (>= 0)."""
    details = _details(tensor)
    if details is None:
        return []
    values = (int(getattr(details, f)) for f in TENSOR_FIELDS[type(details)])
    return [v for v in values if v >= 0]


def named_tensors(tensor: schema.TensorT) -> list[schema.TensorT]:
    """The tensor objects ``tensor``'s linked details name."""
    details = _details(tensor)
    links = getattr(details, _LINKS, None) if details is not None else None
    return list(links.values()) if links else []


def link(m: schema.ModelT) -> None:
    """Links every tensor-naming detail field of ``m`` to the tensor object
    it names (indices out of range are left as found: the verifier refuses
    them before a model is read)."""
    for subgraph in m.subgraphs or []:
        tensors = subgraph.tensors or []
        for tensor in tensors:
            details = _details(tensor)
            if details is None:
                continue
            links = {}
            for field in TENSOR_FIELDS[type(details)]:
                index = int(getattr(details, field))
                if 0 <= index < len(tensors):
                    links[field] = tensors[index]
            setattr(details, _LINKS, links)


def _linked(subgraph: schema.SubGraphT) -> Iterator[tuple[int, schema.TensorT, object]]:
    for i, tensor in enumerate(subgraph.tensors or []):
        details = _details(tensor)
        if details is not None and getattr(details, _LINKS, None):
            yield i, tensor, details


def resolve(m: schema.ModelT) -> int:
    """Writes every linked detail field of ``m`` back as the index of the
    tensor it names in the subgraph of the tensor holding it; a named
    tensor that subgraph does not hold (dropped, or left behind when its
    user was copied into another subgraph) is appended to it.  Returns how
    many tensors were appended."""
    owner: dict[int, int] = {}  # id(tensor) -> subgraph holding it
    for s, subgraph in enumerate(m.subgraphs or []):
        for tensor in subgraph.tensors or []:
            owner.setdefault(id(tensor), s)
    resolved_in: dict[int, int] = {}  # id(details) -> subgraph it was written for
    appended = 0
    for s, subgraph in enumerate(m.subgraphs or []):
        subgraph.tensors = list(subgraph.tensors or [])
        position = {id(t): i for i, t in enumerate(subgraph.tensors)}
        for _, tensor, details in list(_linked(subgraph)):
            if resolved_in.setdefault(id(details), s) != s:
                # One details object shared by tensors of two subgraphs
                # (a shallow copy of a tensor): each gets its own indices.
                tensor.quantization = copy.copy(tensor.quantization)
                details = copy.copy(details)
                tensor.quantization.details = details
                setattr(details, _LINKS, dict(getattr(details, _LINKS)))
                resolved_in[id(details)] = s
            links = getattr(details, _LINKS)
            for field, target in list(links.items()):
                if id(target) not in position:
                    if id(target) in owner:
                        # Held by another subgraph: this one gets a copy.
                        target = copy.deepcopy(target)
                        links[field] = target
                    subgraph.tensors.append(target)
                    position[id(target)] = len(subgraph.tensors) - 1
                    owner.setdefault(id(target), s)
                    appended += 1
                setattr(details, field, position[id(target)])
    return appended


def used_by_details(subgraph: schema.SubGraphT, used: set[int]) -> set[int]:
    """Indices of the tensors that the details of the ``used`` tensors of
    ``subgraph`` name (links first, else the ints), transitively."""
    tensors = subgraph.tensors or []
    position = {id(t): i for i, t in enumerate(tensors)}
    found: set[int] = set()
    todo = [i for i in used if 0 <= i < len(tensors)]
    while todo:
        tensor = tensors[todo.pop()]
        targets = named_tensors(tensor)
        indices = (
            [position[id(t)] for t in targets if id(t) in position]
            if targets
            else [i for i in named_indices(tensor) if i < len(tensors)]
        )
        for index in indices:
            if index not in found and index not in used:
                found.add(index)
                todo.append(index)
    return found
