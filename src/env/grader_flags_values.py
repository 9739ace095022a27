# swerve's flag scanner, its first part (src/env/flags.rs runs grader_flags_values.py and
# grader_flags.py as one script): the values a name or key is spelled with, read from the syntax
# tree without running anything (a literal, or one built from literals by `+`, `%`, `.format`,
# an f-string or `"".join`), and the names they make.

import ast
import unicodedata


def norm(name):
    """Identifiers as Python compares them (NFKC), for names that did not come from the parser."""
    try:
        return unicodedata.normalize("NFKC", name)
    except Exception:
        return name


def reexported(qual):
    """`qual` as the module it goes through names it (`os.sys.settrace` -> `sys.settrace`)."""
    parts = qual.split(".")
    for i in range(1, len(parts) - 1):
        if parts[i] in REEXPORTED:
            return ".".join(parts[i:])
    return qual


def const_str(node, depth=0):
    """The value of a string literal (ast.Constant, or ast.Str before 3.8), or of one built from
    literals alone (`"f_" + "back"`, an f-string of literals, `"".join(["tb_", "frame"])`: a
    name spelled so that no attribute rule sees it), else None."""
    kind = type(node).__name__
    if kind == "Constant":
        value = node.value
        return value if isinstance(value, str) else None
    if kind == "Str":
        return getattr(node, "s", None)
    if depth > 20:
        return None
    if kind == "BinOp" and isinstance(node.op, ast.Add):
        left, right = const_str(node.left, depth + 1), const_str(node.right, depth + 1)
        return left + right if left is not None and right is not None else None
    if kind == "BinOp" and isinstance(node.op, ast.Mod):
        # "__%s__" % "code", "%s.%s" % ("unittest", "case")
        template = const_str(node.left, depth + 1)
        items = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        values = [const_str(e, depth + 1) for e in items]
        if template is None or any(v is None for v in values):
            return None
        try:
            return template % tuple(values)
        except (TypeError, ValueError):
            return None
    if kind == "Call" and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
            and not node.keywords:
        template = const_str(node.func.value, depth + 1)
        values = [const_str(e, depth + 1) for e in node.args]
        if template is None or any(v is None for v in values):
            return None
        try:
            return template.format(*values)
        except (IndexError, KeyError, ValueError):
            return None
    if kind == "FormattedValue" and node.format_spec is None and node.conversion in (-1, None):
        return const_str(node.value, depth + 1)
    if kind == "JoinedStr":
        parts = [const_str(v, depth + 1) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None
    if kind == "Call" and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and len(node.args) == 1 and not node.keywords \
            and isinstance(node.args[0], (ast.List, ast.Tuple)):
        sep = const_str(node.func.value, depth + 1)
        parts = [const_str(e, depth + 1) for e in node.args[0].elts]
        if sep is not None and all(p is not None for p in parts):
            return sep.join(parts)
    return None


def const_int(node):
    kind = type(node).__name__
    value = getattr(node, "value", None) if kind == "Constant" else (
        getattr(node, "n", None) if kind == "Num" else None)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def is_literal(node):
    return type(node).__name__ in ("Constant", "Str", "Bytes", "Num")


def subscript_key(node):
    key = node.slice
    if type(key).__name__ == "Index":
        key = key.value
    return key
