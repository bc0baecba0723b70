"""``fusekit.keras.fuse``: a copy of a Keras model with its standard layers
swapped for fusekit's drop-ins.

How: the model is copied (``keras.models.clone_model`` for Sequential and
Functional models, nested ones included; serialization for other models),
each copied layer gets the original's weights, then every layer reachable in
the copy (graph nodes, layers of nested models, layers held as attributes of
custom layers) whose exact class is in ``SWAPS`` is converted in place.

A swap works in place because a drop-in subclasses the standard layer and
adds no state: converting is a change of class, so the layer keeps its
position wherever it is referenced, its weights and their order.  A later
drop-in registers the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import keras
from keras.src.models.functional import Functional  # no public name; clone_model uses it

from fusekit.errors import FusekitError
from fusekit.keras.attention import FusedAttentionMixin, MultiHeadAttention
from fusekit.keras.layers import NORM_DROP_INS

SwapFunction = Callable[[keras.layers.Layer], "str | None"]
"""Converts a layer of the model copy in place to its drop-in and returns
None, or leaves it unchanged and returns why."""


def class_swap(drop_in: type) -> SwapFunction:
    """The swap of a drop-in that only overrides ``call`` and offers
    ``why_not_fused(input_shape, dtype)``: decided on the layer's
    configuration and build shape, done by changing its class."""

    def swap(layer: keras.layers.Layer) -> str | None:
        shape = None
        if layer.built:
            build = layer.get_build_config() or {}
            shape = build.get("input_shape")
        # The dtype of the inputs is only known at call time; the drop-in
        # checks it there (and falls back with a warning).
        reason = drop_in.why_not_fused(layer, shape, None)
        if reason is None:
            layer.__class__ = drop_in
        return reason

    return swap


DROP_INS: dict[type, type] = {
    **NORM_DROP_INS,
    keras.layers.MultiHeadAttention: MultiHeadAttention,
}
"""Standard Keras class -> its fusekit drop-in."""

SWAPS: dict[type, SwapFunction] = {cls: class_swap(drop_in) for cls, drop_in in DROP_INS.items()}
"""Keras class -> swap function.  Only layers of exactly this class are
swapped: a subclass may compute something else (see SUBCLASS_SWAPS)."""

# What a MultiHeadAttention subclass may not override for its attention
# core to still be Keras' own (which the fused op computes).
_ATTENTION_CORE = (
    "call",
    "_compute_attention",
    "_compute_attention_mask",
    "_compute_causal_mask",
    "_masked_softmax",
    "_build_attention",
)
_FUSED_SUBCLASSES: dict[type, type] = {}


def _attention_subclass_swap(layer: keras.layers.Layer) -> str | None:
    """Swaps a subclass of MultiHeadAttention that keeps Keras' attention
    core: its class becomes a fused twin (the mixin before the subclass), so
    whatever else the subclass does is kept."""
    cls = type(layer)
    base = keras.layers.MultiHeadAttention
    changed = [name for name in _ATTENTION_CORE if getattr(cls, name) is not getattr(base, name)]
    if changed:
        return (
            f"subclass of {_class_name(base)} that overrides {', '.join(changed)}: its "
            "attention may differ from the fused op, left as is"
        )
    fused = _FUSED_SUBCLASSES.get(cls)
    if fused is None:
        fused = type(f"Fused{cls.__name__}", (FusedAttentionMixin, cls), {})
        _FUSED_SUBCLASSES[cls] = fused
    shape = None
    if layer.built:
        shape = (layer.get_build_config() or {}).get("input_shape")
    reason = fused.why_not_fused(layer, shape, None)
    if reason is None:
        layer.__class__ = fused
    return reason


SUBCLASS_SWAPS: dict[type, SwapFunction] = {
    keras.layers.MultiHeadAttention: _attention_subclass_swap,
}
"""Keras class -> swap for its subclasses (layers of exactly the class use
SWAPS): for classes whose subclasses usually only add arguments or
projections around a core fusekit can take over."""


def register_swap(keras_class: type, swap: SwapFunction) -> None:
    """Adds (or replaces) the swap ``fuse`` applies to layers of exactly
    ``keras_class``; see ``SwapFunction`` and ``class_swap``."""
    SWAPS[keras_class] = swap


@dataclass
class LayerEntry:
    """One layer fuse looked at: its path (names of the original model's
    layers from the top down, joined by '/'), its class, and the drop-in or
    the reason it was left."""

    path: str
    keras_class: str
    drop_in: str | None = None
    reason: str | None = None


@dataclass
class FuseReport:
    """What ``fuse`` swapped and what it left (and why)."""

    swapped: list[LayerEntry] = field(default_factory=list)
    left: list[LayerEntry] = field(default_factory=list)

    def to_text(self) -> str:
        lines = [f"fusekit.keras.fuse: swapped {len(self.swapped)}, left {len(self.left)}"]
        for e in self.swapped:
            lines.append(f"  swapped  {e.path}  {e.keras_class} -> {e.drop_in}")
        for e in self.left:
            lines.append(f"  left     {e.path}  {e.keras_class}: {e.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _class_name(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    module = cls.__module__
    # Public names, not where the classes are defined.
    if module.startswith("keras."):
        module = "keras.layers"
    elif module.startswith("fusekit.keras."):
        module = "fusekit.keras"
    return f"{module}.{cls.__name__}"


def _children(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    # Keras tracks sub-layers wherever they are held (Functional graph,
    # Sequential list, attributes, lists and dicts of custom layers).
    return list(layer._flatten_layers(include_self=False, recursive=False))


def _walk(
    copy: keras.layers.Layer, original: keras.layers.Layer
) -> Iterator[tuple[str, keras.layers.Layer]]:
    """Every layer under ``copy`` once, with its path in ``original``: the
    copy has the same structure, but sub-layers a custom layer creates in
    its constructor get new automatic names there."""
    seen: set[int] = set()

    def visit(
        layer: keras.layers.Layer, twin: keras.layers.Layer | None, path: str
    ) -> Iterator[tuple[str, keras.layers.Layer]]:
        children = _children(layer)
        twins = _children(twin) if twin is not None else []
        if len(twins) != len(children):
            twins = [None] * len(children)
        for child, child_twin in zip(children, twins, strict=True):
            if id(child) in seen:  # a shared layer is swapped once
                continue
            seen.add(id(child))
            name = (child_twin if child_twin is not None else child).name
            child_path = f"{path}/{name}" if path else name
            yield child_path, child
            yield from visit(child, child_twin, child_path)

    yield from visit(copy, original, "")


def _subclass_reason(layer: keras.layers.Layer) -> str | None:
    """Why a layer related to a swappable class is left; None if unrelated."""
    cls = type(layer)
    if cls in DROP_INS.values() or cls in _FUSED_SUBCLASSES.values():
        return "already a fusekit drop-in"
    for base in SWAPS:
        if isinstance(layer, base):
            if cls.call is not base.call:
                return (
                    f"subclass of {_class_name(base)} that overrides call: its computation "
                    "may differ from the fused op, left as is"
                )
            return (
                f"subclass of {_class_name(base)}: only the standard class is swapped, left as is"
            )
    return None


def _subclass_swap(layer: keras.layers.Layer) -> SwapFunction | None:
    cls = type(layer)
    if cls in DROP_INS.values() or cls in _FUSED_SUBCLASSES.values():
        return None
    for base, swap in SUBCLASS_SWAPS.items():
        if isinstance(layer, base):
            return swap
    return None


def _copy_functional(model: keras.Model) -> keras.Model:
    pairs: list[tuple[keras.layers.Layer, keras.layers.Layer]] = []

    def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
        copy = layer.__class__.from_config(layer.get_config())
        pairs.append((layer, copy))
        return copy

    copy = keras.models.clone_model(model, clone_function=clone, recursive=True)
    for original, cloned in pairs:
        # Operations written as expressions (x + y on symbolic tensors) are
        # graph nodes too, without weights.
        if not isinstance(original, keras.layers.Layer):
            continue
        weights = original.get_weights()
        if not weights:
            continue
        try:
            cloned.set_weights(weights)
        except ValueError as exc:
            raise FusekitError(
                f"fusekit.keras.fuse: cannot give the copy of layer {original.name!r} "
                f"({_class_name(original)}) its weights: {exc}"
            ) from exc
    return copy


def _copy_other(model: keras.Model) -> keras.Model:
    # A subclassed model: its own get_config/from_config rebuild it (with
    # the recorded build shapes), then the weights are copied as a whole.
    try:
        config = keras.saving.serialize_keras_object(model)
        copy = keras.saving.deserialize_keras_object(
            config, custom_objects={type(model).__name__: type(model)}
        )
        copy.set_weights(model.get_weights())
    except Exception as exc:
        raise FusekitError(
            f"fusekit.keras.fuse: cannot copy {_class_name(model)} {model.name!r} "
            f"(a model class with its own get_config/from_config and build is needed): {exc}"
        ) from exc
    return copy


def fuse(model: keras.Model, verbose: bool = True) -> keras.Model:
    """A new model computing the same outputs with fused ops.

    Standard Keras layers with a fused form (``LayerNormalization``,
    ``RMSNormalization``, ``GroupNormalization``, ``MultiHeadAttention``,
    see ``SWAPS``) become fusekit's drop-ins, and subclasses of
    MultiHeadAttention that keep Keras' attention core their fused twins;
    ``fusekit.convert(fuse(model))`` then holds one fused custom op per
    swapped layer.  The original model is not changed.

    Reached: layers of Sequential and Functional models, of models nested in
    them as layers, and layers that custom layers hold (as attributes, in
    lists or dicts), wherever Keras tracks them.  Not reached: layers a
    custom layer creates inside ``call`` (Keras does not track them), and
    subclasses of the standard norm layers or attention subclasses that
    change the attention core (left, with the reason).

    Args:
      model: a Keras 3 model (Sequential, Functional, or a subclassed model
        that serializes with get_config/from_config).
      verbose: print the report.

    Returns:
      The new model; its ``fusekit_report`` attribute (a ``FuseReport``)
      lists each swapped layer (path, class, drop-in) and each layer left
      with the reason.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"fusekit.keras.fuse takes a keras.Model, got {type(model).__name__}")
    if isinstance(model, (keras.Sequential, Functional)):
        copy = _copy_functional(model)
    else:
        copy = _copy_other(model)

    report = FuseReport()
    for path, layer in _walk(copy, model):
        swap = SWAPS.get(type(layer)) or _subclass_swap(layer)
        if swap is None:
            reason = _subclass_reason(layer)
            if reason is not None:
                report.left.append(LayerEntry(path, _class_name(layer), reason=reason))
            continue
        keras_class = _class_name(layer)
        reason = swap(layer)
        if reason is None:
            report.swapped.append(LayerEntry(path, keras_class, drop_in=_class_name(layer)))
        else:
            report.left.append(LayerEntry(path, keras_class, reason=reason))
    # Not a tracked attribute: the report is not model state.
    copy.__dict__["fusekit_report"] = report
    if verbose:
        print(report.to_text())
    return copy
