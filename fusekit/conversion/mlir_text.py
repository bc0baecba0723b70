"""Reading composites and call sites out of TensorFlow's MLIR text.

TensorFlow offers the imported module only as text, so fusekit reads the few
constructs it needs: ``func.func`` headers with ``tf._implements``, and
symbol references (``f = @fn``, branch/body functions) inside bodies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_FUNC = re.compile(r"^\s*func\.func\s+(?:(private|public)\s+)?@([\w.$-]+)\(")
_IMPLEMENTS = re.compile(r"tf\._implements\s*=\s*#tf_type\.func<@([\w./$-]+),\s*\{")
_SYMBOL_REF = re.compile(
    r"\b(f|then_branch|else_branch|body|cond|branches)\s*=\s*(\[[^\]]*\]|@[\w.$-]+)"
)
_SYMBOL = re.compile(r"@([\w.$-]+)")
_EXPORTED = re.compile(r"tf_saved_model\.exported_names\s*=\s*\[([^\]]*)\]")
_TENSOR = re.compile(r"tensor<([^<>]*(?:<[^<>]*>)?[^<>]*)>")


@dataclass
class MlirFunction:
    symbol: str
    exported_names: list[str]
    implements: str | None
    attrs_text: str
    arg_types: list[str]
    result_types: list[str]
    callees: list[str] = field(default_factory=list)


def _balanced(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket group opening at ``start``."""
    depth = 0
    in_string = False
    i = start
    while i < len(text):
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current, in_string, escape = [], 0, [], False, False
    for ch in text:
        if in_string:
            current.append(ch)
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "[<{(":
            depth += 1
        elif ch in "]>})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _unescape_mlir_string(body: str) -> str:
    # MLIR escapes non-printable bytes as \XX (hex) and quote/backslash.
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in '"\\':
                out += nxt.encode()
                i += 2
                continue
            if re.match(r"[0-9A-Fa-f]{2}", body[i + 1 : i + 3]):
                out.append(int(body[i + 1 : i + 3], 16))
                i += 3
                continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", errors="replace")


def parse_attr_value(text: str) -> tuple[Any, str]:
    """(value, type name) of one MLIR attribute as TF prints it."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true", "bool"
    if text.startswith('"'):
        return _unescape_mlir_string(text[1:-1]), "str"
    if text.startswith("["):
        items = [parse_attr_value(p) for p in _split_top_level(text[1:-1])]
        kinds = {k for _, k in items}
        kind = kinds.pop() if len(kinds) == 1 else ("empty" if not items else "mixed")
        return [v for v, _ in items], f"list[{kind}]"
    m = re.match(r"^(-?[0-9.eE+-]+|0x[0-9A-Fa-f]+)\s*:\s*([if])(\d+)$", text)
    if m:
        number, kind, _bits = m.groups()
        if kind == "i":
            return int(number, 0), "int"
        return float(number), "float"
    if re.match(r"^-?\d+$", text):
        return int(text), "int"
    if re.match(r"^-?[0-9.]+(?:[eE][+-]?\d+)?$", text):
        return float(text), "float"
    # dense<...> tensors, #tf_type.shape<...>, types: the converter cannot
    # carry them (they stay text in the plan).
    return text, "unsupported"


def parse_attrs(attrs_text: str) -> dict[str, tuple[Any, str]]:
    attrs = {}
    for part in _split_top_level(attrs_text):
        if "=" not in part:
            attrs[part.strip()] = (True, "unit")
            continue
        key, value = part.split("=", 1)
        attrs[key.strip()] = parse_attr_value(value)
    return attrs


def _types_in(text: str) -> list[str]:
    return [f"tensor<{m}>" for m in _TENSOR.findall(text)]


def parse_functions(mlir: str) -> dict[str, MlirFunction]:
    """Every func.func of the module by symbol, with its callees."""
    functions: dict[str, MlirFunction] = {}
    current: MlirFunction | None = None
    for line in mlir.splitlines():
        m = _FUNC.match(line)
        if m:
            symbol = m.group(2)
            args_end = _balanced(line, m.end() - 1, "(", ")")
            args_text = line[m.end() : args_end - 1]
            rest = line[args_end:]
            attributes_at = rest.find(" attributes {")
            results_text = rest if attributes_at < 0 else rest[:attributes_at]
            implements = None
            attrs_text = ""
            im = _IMPLEMENTS.search(line)
            if im:
                implements = im.group(1)
                brace = im.end() - 1
                attrs_text = line[brace + 1 : _balanced(line, brace, "{", "}") - 1]
            exported = _EXPORTED.search(line)
            current = MlirFunction(
                symbol=symbol,
                exported_names=[s.strip().strip('"') for s in exported.group(1).split(",")]
                if exported and m.group(1) != "private"
                else [],
                implements=implements,
                attrs_text=attrs_text,
                arg_types=[
                    t
                    for part in _split_top_level(args_text)
                    for t in _types_in(part.split(":", 1)[1] if ":" in part else part)[:1]
                ],
                result_types=[t for t in _types_in(results_text) if "resource" not in t],
            )
            functions[symbol] = current
            continue
        if current is None:
            continue
        for ref in _SYMBOL_REF.finditer(line):
            current.callees.extend(_SYMBOL.findall(ref.group(2)))
    return functions


def instance_counts(
    functions: dict[str, MlirFunction], roots: list[str], opaque: set[str] = frozenset()
) -> dict[str, int]:
    """How many times each function is instantiated once every call from the
    roots is inlined (a function called twice by a function called twice
    counts four).  Calls inside ``opaque`` functions (composites that become
    one op) are not followed."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(symbol: str, stack: set[str]) -> None:
        if symbol in seen or symbol not in functions or symbol in stack:
            return
        stack.add(symbol)
        if symbol not in opaque:
            for callee in functions[symbol].callees:
                visit(callee, stack)
        stack.discard(symbol)
        seen.add(symbol)
        order.append(symbol)

    for root in roots:
        visit(root, set())
    counts = {symbol: 0 for symbol in seen}
    for root in roots:
        if root in counts:
            counts[root] += 1
    # Callers come after callees in `order`: walk it backwards.
    for symbol in reversed(order):
        if symbol in opaque:
            continue
        for callee in functions[symbol].callees:
            if callee in counts:
                counts[callee] += counts[symbol]
    return counts
