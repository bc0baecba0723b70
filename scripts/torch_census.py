"""Counting the norm, attention and rotary instances a PyTorch model computes.

scripts/torch_zoo.py records, for every model it exports, how many
instances of each kind the PyTorch module holds, counted here while the
module runs (not read back from the .tflite file, which is what fusekit is
tested on).  ``Census`` is a context manager: forward hooks on every module
and a ``TorchFunctionMode`` see each call, and a few tags carried on the
tensors follow the data from op to op.

* A **norm** is one call of a normalization module (``nn.LayerNorm``,
  ``nn.GroupNorm``, ``nn.RMSNorm`` and the libraries' own, e.g. Hugging
  Face's ``*RMSNorm``, T5's RMS ``T5LayerNorm``, timm's ``LayerNorm2d`` and
  ``GroupNorm1``), counted at the innermost such module, or one call of
  ``F.layer_norm`` / ``F.group_norm`` / ``F.rms_norm`` outside them, or one
  ``rsqrt`` of a mean (of squares: RMS; of a centered tensor: layer) written
  out outside them (litert-torch's per-head q/k norms in its composites).  Batch
  norms are not counted (they fold into the convolutions).
* An **attention** is one ``F.scaled_dot_product_attention`` or
  ``F.multi_head_attention_forward`` call, or one softmax whose input comes
  from a product of two activations (the scores) and whose output reaches
  another product with an activation (P.V), through any ops in between
  (masks, biases, talking-head convolutions).  A softmax over anything else
  (a mixture-of-experts router) is not one.
* A **rotary** instance is one tensor RoPE is applied to (queries and keys
  count separately): ``x * cos + rotate(x) * sin`` where ``rotate`` is made
  of slices of ``x`` (rotate-half, interleaved pairs, or the split form
  ``cat(x1 cos - x2 sin, x2 cos + x1 sin)``).

Every instance is also judged **live** or **dead** in the signature: live
when its result reaches one of the module's outputs.  An exporter removes
dead computation (a prefill signature that returns only the KV caches has
no use for the last layer's attention output, its post-attention norms or
the final norm), so a dead instance cannot appear in the .tflite file.  The
forward pass runs with autograd recording (the weights require grad), and
an instance is live when the autograd node that made its result is reached
walking back from the outputs' nodes: exact for the data flow of float
tensors, in-place updates of a cache included.  (A result reaching an
output only through integer indices would read as dead; none of the
counted kinds feeds an output that way.)
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.overrides import TorchFunctionMode

KINDS = ("layer_norm", "rms_norm", "group_norm", "attention", "rotary")

# litert-torch's Hugging Face exporter writes its products as bmm_4d, an
# operator of its own.
_MATMULS = {"matmul", "__matmul__", "bmm", "mm", "einsum", "baddbmm", "bmm_4d"}
_SOFTMAX = {"softmax", "_softmax"}
_FUNCTIONAL_NORMS = {"layer_norm": "layer_norm", "group_norm": "group_norm", "rms_norm": "rms_norm"}
_ATTENTION_CALLS = {"scaled_dot_product_attention": "sdpa", "multi_head_attention_forward": "mha"}
# Ops that mix channels with a weight: on the path of the scores or the
# probabilities they mean heads are mixed (talking heads).
_MIXING = {"conv1d", "conv2d", "linear"}
_REDUCTIONS = {"mean", "var", "var_mean", "std", "rsqrt", "norm", "sum"}
# Ops that keep a tensor's values, only moving them: the result is the same
# tensor for RoPE's purposes.
_SHAPE_OPS = {
    "view",
    "reshape",
    "transpose",
    "permute",
    "contiguous",
    "unflatten",
    "flatten",
    "to",
    "float",
    "type_as",
    "clone",
    "unsqueeze",
    "squeeze",
    "expand",
}
_SLICES = {"__getitem__", "split", "chunk", "tensor_split", "narrow", "unbind", "split_with_sizes"}
_GATHERS = {"__getitem__", "index_select", "take", "gather"}
_NEGATE = {"neg", "__neg__", "negative"}
_JOIN = {"cat", "concat", "concatenate", "stack"}
_MUL = {"mul", "__mul__", "__rmul__", "multiply"}
_ADD = {"add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "subtract"}
_STATISTICS = {"mean", "var", "var_mean", "sum"}
_RSQRT = {"rsqrt", "sqrt"}
_STAT_KEEP = {"add", "__add__", "__radd__", "to", "float", "type_as", "contiguous"}
_RMS_NAMED = {"T5LayerNorm"}  # named a layer norm, computes an RMS norm


@dataclass
class _Tag:
    """What the census knows of one tensor."""

    serial: int
    # Depends on the model's inputs (not only on weights and constants).
    dep: bool = True
    # The serial of the tensor this one is a reshaped view of.
    alias: int = 0
    # Scores (a product of two activations on the way to a softmax), and
    # whether a weight mixed them.
    scores: bool = False
    mixed: bool = False
    # Probabilities: the softmax calls this tensor carries.
    probs: frozenset[int] = frozenset()
    # RoPE: the tensors this one is a slice (or a rotation of slices) of,
    # and the (tensor, from-a-slice) pairs a product with it is linear in.
    piece_of: frozenset[int] = frozenset()
    terms: frozenset[tuple[int, bool]] = frozenset()
    # Norms written out: a reduced statistic ("rms": of x, "layer": of x
    # minus its mean) on its way to an rsqrt, and x minus a mean of it.
    stat: str = ""
    centered: bool = False


@dataclass
class Counts:
    """The instances one forward pass computed."""

    kinds: Counter = field(default_factory=Counter)
    # The instances whose result reaches none of the outputs, by kind.
    dead: Counter = field(default_factory=Counter)
    # Detail: norms by module class, attention by how it is written.
    norms: Counter = field(default_factory=Counter)
    attention: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": {k: int(self.kinds.get(k, 0)) for k in KINDS},
            "dead": {k: int(self.dead[k]) for k in KINDS if self.dead[k]},
            "norm_modules": dict(sorted(self.norms.items())),
            "attention_forms": dict(sorted(self.attention.items())),
        }


def _norm_kind(module: nn.Module) -> str | None:
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return None
    if isinstance(module, nn.GroupNorm):
        return "group_norm"
    if isinstance(module, nn.LayerNorm):
        return "layer_norm"
    if isinstance(module, nn.RMSNorm):
        return "rms_norm"
    name = type(module).__name__
    lower = name.lower()
    if "norm" not in lower or "batch" in lower:
        return None
    if "rms" in lower or name in _RMS_NAMED:
        return "rms_norm"
    if "group" in lower:
        return "group_norm"
    return "layer_norm"


def _norm_label(module: nn.Module) -> str:
    label = type(module).__name__
    if isinstance(module, nn.GroupNorm):
        label += f"(groups={module.num_groups}, channels={module.num_channels})"
    return label


@dataclass
class _Frame:
    module: nn.Module
    kind: str
    functional: list[str] = field(default_factory=list)
    reduced: bool = False
    nested: bool = False


class Census(TorchFunctionMode):
    """``with Census(model) as census: model(...)`` then ``census.counts``."""

    def __init__(self, *modules: nn.Module) -> None:
        super().__init__()
        self.counts = Counts()
        self._serials = itertools.count(1)
        self._tags: dict[int, tuple[weakref.ref, _Tag]] = {}
        self._const: set[int] = set()
        for module in modules:
            for t in itertools.chain(module.parameters(), module.buffers()):
                self._const.add(id(t))
                self._tag(t).dep = False
        self._frames: list[_Frame] = []
        self._counted_probs: set[int] = set()
        self._mixed_probs: set[int] = set()
        self._roped: set[int] = set()
        self._hooks: list[Any] = []
        # (kind, the autograd node that made the instance's result).
        self._made: list[tuple[str, Any]] = []

    # -- tags ---------------------------------------------------------------

    def _tag(self, t: torch.Tensor) -> _Tag:
        entry = self._tags.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        serial = next(self._serials)
        tag = _Tag(serial=serial, alias=serial)
        self._tags[id(t)] = (weakref.ref(t), tag)
        return tag

    def _set(self, t: torch.Tensor, tag: _Tag) -> None:
        self._tags[id(t)] = (weakref.ref(t), tag)

    # -- module hooks (norms) -----------------------------------------------

    def __enter__(self) -> Census:
        self._hooks = [
            nn.modules.module.register_module_forward_pre_hook(self._pre),
            nn.modules.module.register_module_forward_hook(self._post),
        ]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()
        super().__exit__(*exc)

    def _pre(self, module: nn.Module, args: Any) -> None:  # noqa: ANN401
        kind = _norm_kind(module)
        if kind is not None:
            self._frames.append(_Frame(module, kind))

    def _post(self, module: nn.Module, args: Any, out: Any) -> None:  # noqa: ANN401
        if not self._frames or self._frames[-1].module is not module:
            return
        frame = self._frames.pop()
        counted = False
        if not frame.nested:
            if frame.functional:
                for kind in frame.functional:
                    self._count_norm(kind, _norm_label(module), out)
                counted = True
            elif frame.reduced or isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)):
                self._count_norm(frame.kind, _norm_label(module), out)
                counted = True
        if (counted or frame.nested) and self._frames:
            self._frames[-1].nested = True

    def _count_norm(self, kind: str, label: str, result: Any) -> None:  # noqa: ANN401
        self._count(kind, result)
        self.counts.norms[f"{kind}: {label}"] += 1

    def _count(self, kind: str, result: Any) -> None:  # noqa: ANN401
        """One instance of ``kind`` whose result is ``result`` (a tensor or
        a structure of tensors)."""
        self.counts.kinds[kind] += 1
        nodes = [
            t.grad_fn
            for t in pytree.tree_leaves(result)
            if isinstance(t, torch.Tensor) and t.grad_fn is not None
        ]
        self._made.append((kind, nodes))

    def judge(self, outputs: Any) -> None:  # noqa: ANN401
        """Counts the instances none of whose results reaches ``outputs``
        (the module's return value) as dead."""
        seen: set[Any] = set()
        stack = [t.grad_fn for t in _leaves(outputs) if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            stack.extend(n for n, _ in node.next_functions if n is not None and n not in seen)
        for kind, nodes in self._made:
            # No node: the result does not depend on a weight (nothing to
            # judge by); counted live.
            if nodes and not any(n in seen for n in nodes):
                self.counts.dead[kind] += 1

    # -- function mode (attention, rotary, functional norms) ----------------

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # An operator registered with torch.library is named "op.overload".
        name = getattr(func, "__name__", "").split(".")[0]
        if name == "__get__":  # attribute reads (.shape, .dtype)
            return out
        try:
            self._observe(name, args, kwargs, out)
        except Exception as error:  # the census must never change what runs
            raise RuntimeError(f"census failed on {name}: {error}") from error
        return out

    def _observe(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:  # noqa: ANN401
        ins = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outs:
            return
        in_tags = [self._tag(t) for t in ins]
        dep = any(t.dep for t in in_tags)
        if name in _GATHERS and ins and not in_tags[0].dep:
            # Weights picked by computed indices (a mixture of experts'
            # gathered matrices) are weights, not activations.
            dep = False
        base = _Tag(serial=0, dep=dep)
        base.scores = any(t.scores for t in in_tags)
        base.mixed = any(t.mixed for t in in_tags)
        base.probs = frozenset().union(*(t.probs for t in in_tags)) if in_tags else frozenset()

        if name in _FUNCTIONAL_NORMS:
            self._functional_norm(_FUNCTIONAL_NORMS[name], out)
        if name in _REDUCTIONS and self._frames:
            self._frames[-1].reduced = True
        if name in _ATTENTION_CALLS:
            self._count("attention", out)
            self.counts.attention[_ATTENTION_CALLS[name]] += 1
            base.scores, base.probs = False, frozenset()
        elif name in _MATMULS:
            operands = [t for t in in_tags if t.dep]
            if name == "baddbmm":
                operands = [self._tag(t) for t in args[1:3] if isinstance(t, torch.Tensor)]
                operands = [t for t in operands if t.dep]
            carried = frozenset().union(*(t.probs for t in operands)) if operands else frozenset()
            if carried:
                for prob in carried - self._counted_probs:
                    self._counted_probs.add(prob)
                    self._count("attention", out)
                    form = "softmax, heads mixed" if prob in self._mixed_probs else "softmax"
                    self.counts.attention[form] += 1
                base.scores, base.mixed, base.probs = False, False, frozenset()
            elif len(operands) >= 2:
                base.scores = True
        elif name in _SOFTMAX and base.scores:
            prob = next(self._serials)
            if base.mixed:
                self._mixed_probs.add(prob)
            base.scores, base.mixed, base.probs = False, False, frozenset({prob})
        elif name in _MIXING and (base.scores or base.probs):
            base.mixed = True
            self._mixed_probs.update(base.probs)

        for t in outs:
            if id(t) in self._const:
                continue
            tag = _Tag(
                serial=next(self._serials),
                dep=base.dep,
                scores=base.scores,
                mixed=base.mixed,
                probs=base.probs,
            )
            tag.alias = tag.serial
            self._rope(name, args, ins, in_tags, t, tag)
            self._statistic(name, in_tags, tag, t)
            self._set(t, tag)

    def _statistic(self, name: str, in_tags: list[_Tag], tag: _Tag, out: torch.Tensor) -> None:
        """``rsqrt(mean(x^2) + eps)`` written out: a norm of its own where no
        norm module or functional norm computes it."""
        if not in_tags or not in_tags[0].dep:
            return
        first = in_tags[0]
        if name in _STATISTICS:
            tag.stat = "layer" if first.centered or name in ("var", "var_mean") else "rms"
        elif name in _STAT_KEEP and any(t.stat for t in in_tags):
            tag.stat = next(t.stat for t in in_tags if t.stat)
        elif name in {"sub", "__sub__"} and len(in_tags) == 2 and in_tags[1].stat:
            tag.centered = True
        elif name in {"pow", "__pow__", "mul", "__mul__", "square"} and first.centered:
            tag.centered = True
        elif name in _RSQRT and first.stat and not self._frames:
            self._count_norm(f"{first.stat}_norm", f"{name}(statistic) outside a norm module", out)

    def _functional_norm(self, kind: str, out: Any) -> None:  # noqa: ANN401
        if self._frames:
            self._frames[-1].functional.append(kind)
        else:
            self._count_norm(kind, f"F.{kind}", out)

    def _rope(
        self,
        name: str,
        args: tuple,
        ins: list[torch.Tensor],
        in_tags: list[_Tag],
        out: torch.Tensor,
        tag: _Tag,
    ) -> None:
        """Follows slices of a tensor into ``x cos + rotate(x) sin``."""
        if not ins:
            return
        first, first_tag = ins[0], in_tags[0]
        if name in _SHAPE_OPS or name in _NEGATE:
            tag.alias = first_tag.alias if name in _SHAPE_OPS else tag.serial
            tag.piece_of = first_tag.piece_of
            tag.terms = first_tag.terms
        elif name in _SLICES and first.dim() >= 1:
            sliced = (
                out.dim() == first.dim()
                and out.shape[:-1] == first.shape[:-1]
                and out.shape[-1] < first.shape[-1]
            ) or (name == "unbind" and out.shape == first.shape[:-1] and first.shape[-1] == 2)
            if sliced and first_tag.dep:
                tag.piece_of = frozenset({first_tag.alias}) | first_tag.piece_of
        elif name in _JOIN and len(ins) >= 2:
            common = frozenset.intersection(*(t.piece_of for t in in_tags))
            if common and all(t.piece_of for t in in_tags):
                tag.piece_of = common
        elif name in _MUL and len(ins) == 2:
            terms: set[tuple[int, bool]] = set()
            for t in in_tags:
                if not t.dep:
                    continue
                terms.add((t.alias, False))
                terms.update((p, True) for p in t.piece_of)
            tag.terms = frozenset(terms)
        elif name in _ADD and len(ins) == 2 and all(t.terms for t in in_tags):
            a, b = in_tags[0].terms, in_tags[1].terms
            bases_a = {base for base, _ in a}
            shared = [
                base for base, derived in b if base in bases_a and (derived or (base, True) in a)
            ]
            # The nearest tensor the two terms share (q, not the fused qkv
            # projection q was sliced from) is the one rotated.
            if shared and max(shared) not in self._roped:
                self._roped.add(max(shared))
                self._count("rotary", out)


def _leaves(value: Any) -> list[torch.Tensor]:  # noqa: ANN401
    """Tensors among a signature's inputs (litert-torch's KV caches too)."""
    out = []
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif hasattr(leaf, "caches"):
            for entry in leaf.caches:
                out += [entry.k_cache, entry.v_cache]
    return out


def count(module: nn.Module, args: tuple = (), kwargs: dict | None = None) -> dict[str, Any]:
    """Runs ``module(*args, **kwargs)`` once and returns what it computed:
    ``counts`` by kind, ``dead`` (by kind, the instances whose result
    reaches none of the outputs), ``norm_modules`` and ``attention_forms``."""
    kwargs = kwargs or {}
    census = Census(module)
    for t in _leaves((args, kwargs)):
        census._tag(t).dep = True
    # Autograd records the data flow for Census.judge: the floating
    # weights require grad while the module runs.
    weights = [p for p in module.parameters() if p.is_floating_point() and not p.requires_grad]
    for p in weights:
        p.requires_grad_(True)
    try:
        with torch.enable_grad(), census:
            result = module(*args, **kwargs)
        census.judge(result)
    finally:
        for p in weights:
            p.requires_grad_(False)
    return census.counts.as_dict()
