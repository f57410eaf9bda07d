# The type stubs (backplane/__init__.pyi, nn.pyi) against the module: every
# public name of the package and of each class is declared, and nothing the
# stubs declare is missing at runtime. The stubs are read from the package as
# built (copied next to the extension), so the shipped files are checked.
import ast
import keyword
import os
import re

import backplane as bp

PACKAGE = os.path.dirname(bp.__file__)
ABI_H = os.path.join(os.path.dirname(__file__), "..", "..", "include", "backplane", "abi.h")
STUB_ONLY = {"PathLike", "ShapeLike", "DTypeLike", "DeviceLike", "ArrayLike", "Operand", "ReduceOpLike", "_F"}


def declared(path):
    tree = ast.parse(open(path).read(), path)
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            names = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
            for base in node.bases:  # inherited from a class declared earlier in the stub
                if isinstance(base, ast.Name):
                    names |= members.get(base.id, set())
            members[node.name] = names
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):  # `from . import nn as nn`: an explicit re-export (PEP 484)
            top.update(alias.name for alias in node.names if alias.asname == alias.name)
    return top, members


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def check_module(module, stub):
    top, members = declared(os.path.join(PACKAGE, stub))
    runtime = public(module)
    assert runtime - top == set(), f"missing from {stub}"
    assert (top - STUB_ONLY) - runtime - {"__version__"} == set(), f"in {stub} but not in the module"
    for name, names in members.items():
        cls = getattr(module, name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            continue
        # Enum plumbing, and names no stub can spell (Capability.async, a keyword).
        want = {n for n in public(cls) - {"name", "value"} if not keyword.iskeyword(n)}
        if hasattr(cls, "__members__"):
            want -= set(cls.__members__)
            lacking = sorted(set(cls.__members__) - names)
            assert not lacking, f"{stub}: class {name} lacks the values {lacking}: add a line `    <value>: int` for each"
        assert want - names == set(), f"{stub}: {name} lacks members {sorted(want - names)}"


def test_package_stubs_match():
    check_module(bp, "__init__.pyi")


def test_nn_stubs_match():
    check_module(bp.nn, "nn.pyi")


def test_py_typed_marker_ships():
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))


def op_table():
    """(value, name) of each row of abi.h's BP_OP_TABLE: X(NAME, value, name, ...)."""
    rows = re.findall(r"X\([A-Z_0-9]+, (\d+), (\w+),", open(ABI_H).read())
    assert rows, f"{ABI_H}: no BP_OP_TABLE rows found (X(NAME, value, name, ...))"
    return {name: int(value) for value, name in rows}


def test_op_enum_is_the_op_table():
    # backplane.Op is made from BP_OP_TABLE; the stub is checked against it above.
    table = op_table()
    module = {name: int(member.value) for name, member in bp.Op.__members__.items()}
    missing = sorted(set(table) - set(module))
    assert not missing, f"backplane.Op lacks {missing}, rows of BP_OP_TABLE in include/backplane/abi.h: " \
                        "python/src/module.cpp must bind every row"
    extra = sorted(set(module) - set(table))
    assert not extra, f"backplane.Op has {extra}, which BP_OP_TABLE in include/backplane/abi.h does not"
    wrong = sorted(n for n in table if module[n] != table[n])
    assert not wrong, f"backplane.Op values differ from BP_OP_TABLE's for {wrong}"
