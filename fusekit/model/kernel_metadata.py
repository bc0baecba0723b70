"""The kernels a model needs, recorded in the model: a ``Model.metadata``
entry fusekit writes into every model it packs.

A fused model opened in a runtime without fusekit's kernels fails with only
"unresolved custom op NAME".  The entry says which custom ops the model's
operators use, where each kernel comes from (fusekit's library: ``pip install
fusekit``; a user's plugin, by the name ``fusekit.build_plugin`` gave it), the
fusekit version that wrote it and the entry's own format version, so that
tools (``fusekit inspect MODEL.tflite``) and fusekit's own errors can say
what to install.

The entry is the TFLite schema's own mechanism: ``Model.metadata`` holds
(name, buffer index) pairs; the buffer holds UTF-8 JSON::

    {"format": 1, "fusekit_version": "0.9.0",
     "kernels": [{"op": "fusekit_layer_norm", "provider": "fusekit"},
                 {"op": "my_op", "provider": "plugin", "plugin": "my_ops"}]}

Written through the schema's object API (conversion side), read through
``tflite_schema`` (runtime side, no TensorFlow).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fusekit._version import __version__
from fusekit.model import tflite_schema
from fusekit.model.model_check import ModelBuffer

#: The metadata entry's name.
ENTRY = "fusekit_kernels"
#: Version of the entry's JSON layout.
FORMAT = 1
#: How fusekit's own kernels are installed.
INSTALL = "pip install fusekit"
_LIBRARY_PREFIX = "fusekit_"


@dataclass(frozen=True)
class KernelNeed:
    """One custom op a model's operators use, and where its kernel comes
    from: ``provider`` "fusekit" (fusekit's library), "plugin" (a user's
    plugin, ``plugin`` its name) or "unknown" (not a kernel fusekit knew
    when it wrote the model)."""

    op: str
    provider: str
    plugin: str | None = None

    def where(self) -> str:
        """The way to get this kernel, in a user's words."""
        if self.provider == "fusekit":
            return f"fusekit's kernel library ({INSTALL}; fusekit.Interpreter loads it)"
        if self.provider == "plugin":
            return (
                f"the plugin {self.plugin!r} (lib{self.plugin}.so, made with "
                f"fusekit.build_plugin({self.plugin!r}, ...) / `fusekit build {self.plugin} ...`; "
                "pass it as plugins=[path] / --plugin PATH)"
            )
        return "a kernel fusekit does not provide (not one of its ops or known plugins)"


@dataclass
class KernelMetadata:
    """The entry's content."""

    kernels: list[KernelNeed]
    fusekit_version: str = __version__
    format: int = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        kernels = [
            {k: v for k, v in asdict(need).items() if v is not None} for need in self.kernels
        ]
        data = {"format": self.format, "fusekit_version": self.fusekit_version}
        return json.dumps({**data, "kernels": kernels, **self.extra}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> KernelMetadata | None:
        """The entry read back, or None when it is not one this reader
        understands (malformed, or a newer format)."""
        try:
            raw = json.loads(data.decode("utf-8"))
            kernels = [
                KernelNeed(str(k["op"]), str(k.get("provider", "unknown")), k.get("plugin"))
                for k in raw.get("kernels", [])
            ]
            extra = {
                k: v for k, v in raw.items() if k not in ("format", "fusekit_version", "kernels")
            }
            return cls(kernels, str(raw.get("fusekit_version", "")), int(raw["format"]), extra)
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def need(self, op: str) -> KernelNeed | None:
        return next((k for k in self.kernels if k.op == op), None)

    def advice(self, ops: list[str] | None = None) -> str:
        """Where the kernels of ``ops`` (default: all) come from, one
        clause per op, as the model says."""
        wanted = self.kernels if ops is None else [self.need(op) for op in ops]
        by_source: dict[str, list[str]] = {}
        for need in wanted:
            if need is not None:
                by_source.setdefault(need.where(), []).append(need.op)
        if not by_source:
            return ""
        return f"the model (written by fusekit {self.fusekit_version}) says: " + "; ".join(
            f"{', '.join(ops)} {'comes' if len(ops) == 1 else 'come'} from {where}"
            for where, ops in by_source.items()
        )


def _used_custom_ops(m: Any) -> list[str]:
    """Custom codes of the operator codes any operator of ``m`` uses."""
    used = {op.opcodeIndex for sg in m.subgraphs or [] for op in sg.operators or []}
    names = set()
    for i in used:
        code = m.operatorCodes[i].customCode
        if code:
            names.add(code.decode() if isinstance(code, bytes) else str(code))
    return sorted(names)


def _entry_of(m: Any) -> tuple[Any, KernelMetadata | None]:
    """The object-API metadata entry and its content, if ``m`` has one."""
    import numpy as np

    for meta in m.metadata or []:
        name = meta.name.decode() if isinstance(meta.name, bytes) else meta.name
        if name == ENTRY and 0 <= meta.buffer < len(m.buffers or []):
            data = m.buffers[meta.buffer].data
            raw = b"" if data is None else np.asarray(data, np.uint8).tobytes()
            return meta, KernelMetadata.from_bytes(raw)
    return None, None


def stamp(m: Any, plugins: Mapping[str, str] | None = None) -> KernelMetadata:
    """Writes (or rewrites) ``m``'s entry from the custom ops its operators
    use.  ``plugins``: op -> plugin name for users' kernels; an op neither
    there nor one of fusekit's keeps what an earlier entry said of it.  The
    entry's buffer is reused when it exists, else appended: no other buffer
    index moves."""
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    plugins = dict(plugins or {})
    meta, earlier = _entry_of(m)
    needs = []
    for op in _used_custom_ops(m):
        if op in plugins:
            needs.append(KernelNeed(op, "plugin", plugins[op]))
        elif op.startswith(_LIBRARY_PREFIX):
            needs.append(KernelNeed(op, "fusekit"))
        elif earlier is not None and earlier.need(op) is not None:
            needs.append(earlier.need(op))  # type: ignore[arg-type]
        else:
            needs.append(KernelNeed(op, "unknown"))
    content = KernelMetadata(needs)
    data = np.frombuffer(content.to_bytes(), np.uint8).copy()
    if meta is None:
        buffer = schema.BufferT()
        buffer.data = data
        m.buffers = [*(m.buffers or []), buffer]
        meta = schema.MetadataT()
        meta.name = ENTRY
        meta.buffer = len(m.buffers) - 1
        m.metadata = [*(m.metadata or []), meta]
    else:
        buffer = m.buffers[meta.buffer]
        buffer.data = data
        # Inline now: a blob after the flatbuffer would be appended again.
        buffer.offset, buffer.size = 0, 0
    return content


def read(model: ModelBuffer) -> KernelMetadata | None:
    """The entry of a .tflite model, or None (no entry: a model fusekit did
    not write, or an older one).  Reads the flatbuffer in place."""
    root = tflite_schema.model(model)
    buffers = root.items("buffers")
    for meta in root.items("metadata"):
        if (meta.string("name") or b"") != ENTRY.encode():
            continue
        index = int(meta.scalar("buffer"))
        if not 0 <= index < len(buffers):
            return None
        buffer = buffers[index]
        offset = int(buffer.scalar("offset"))
        if offset > 1:
            data = bytes(model[offset : offset + int(buffer.scalar("size"))])
        else:
            data = buffer.blob("data") or b""
        return KernelMetadata.from_bytes(data)
    return None
