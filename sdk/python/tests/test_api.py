"""The exported API only grows: every line of api.txt (the committed
listing, made by introspection) is still produced from the package, and
every line produced is in api.txt. ``python3 tests/test_api.py --update``
rewrites it, in the change that adds to the API (as sdk/go's -update)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import types
import unittest
from typing import Any

from support import ROOT

import torpor

API_TXT = ROOT / "api.txt"

# Dunder methods that are API (iteration, context managers).
_DUNDERS = {"__init__", "__iter__", "__next__", "__enter__", "__exit__"}


class _Raw:
    """An annotation written as text, shown as it is written."""

    def __init__(self, s: str) -> None:
        self.s = s

    def __repr__(self) -> str:
        return self.s


def _text(a: Any) -> Any:
    return _Raw(a) if isinstance(a, str) else a


def signature(f: Any, drop_first: bool) -> str:
    sig = inspect.signature(f)
    params = list(sig.parameters.values())
    if drop_first and params:
        params = params[1:]
    params = [p.replace(annotation=_text(p.annotation)) for p in params]
    return str(sig.replace(parameters=params, return_annotation=_text(sig.return_annotation)))


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, type):
        return v.__name__
    return repr(v)


def _base(b: type, module: str) -> str:
    return b.__name__ if b.__module__.split(".")[0] == module or b.__module__ == "builtins" else f"{b.__module__}.{b.__qualname__}"


def listing(mod: types.ModuleType) -> list[str]:
    """One sorted line per public name of mod (its __all__), and per public
    method, field, attribute and enum member of its classes, each with its
    signature."""
    top = mod.__name__.split(".")[0]
    lines: list[str] = []
    for name in getattr(mod, "__all__", [n for n in vars(mod) if not n.startswith("_")]):
        obj = getattr(mod, name)
        if isinstance(obj, type):
            lines.append(f"class {name}({', '.join(_base(b, top) for b in obj.__bases__)})")
            if issubclass(obj, enum.Enum):
                lines += [f"member {name}.{m.name} = {m.value!r}" for m in obj]
                continue
            fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
            own = vars(obj)
            for a, t in own.get("__annotations__", {}).items():
                if a.startswith("_"):
                    continue
                if a in fields:
                    f = fields[a]
                    d = "" if f.default is dataclasses.MISSING else f" = {f.default!r}"
                    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                        d = f" = {getattr(f.default_factory, '__name__', 'factory')}()"
                    lines.append(f"field {name}.{a}: {t}{d}")
                else:
                    lines.append(f"attr {name}.{a}: {t}")
            for m, v in own.items():
                if m.startswith("_") and m not in _DUNDERS:
                    continue
                if m == "__init__" and fields:
                    continue  # a dataclass's: its fields say it
                if isinstance(v, classmethod):
                    lines.append(f"classmethod {name}.{m}{signature(v.__func__, True)}")
                elif isinstance(v, staticmethod):
                    lines.append(f"staticmethod {name}.{m}{signature(v.__func__, False)}")
                elif inspect.isfunction(v):
                    lines.append(f"method {name}.{m}{signature(v, True)}")
                elif isinstance(v, property):
                    lines.append(f"property {name}.{m}")
        elif callable(obj):
            lines.append(f"def {name}{signature(obj, False)}")
        else:
            lines.append(f"const {name} = {_value(obj)}")
    return sorted(lines)


def committed() -> list[str]:
    return [l.strip() for l in API_TXT.read_text().splitlines() if l.strip() and not l.startswith("#")]


class API(unittest.TestCase):
    def test_only_grows(self) -> None:
        got = listing(torpor)
        want = committed()
        gone = [l for l in want if l not in got]
        self.assertEqual(gone, [], "the SDK's API only grows: removed or changed (api.txt)")
        new = [l for l in got if l not in want]
        self.assertEqual(new, [], "exported API not in api.txt: run python3 tests/test_api.py --update and commit api.txt with it")

    def test_typed(self) -> None:
        # Every public function and method is annotated, every parameter and
        # its return, and the annotations resolve (py.typed promises it).
        import typing
        for name in torpor.__all__:
            obj = getattr(torpor, name)
            fns = [(name, obj)] if inspect.isfunction(obj) else []
            if isinstance(obj, type) and not issubclass(obj, enum.Enum):
                for m, v in vars(obj).items():
                    v = v.__func__ if isinstance(v, (classmethod, staticmethod)) else v
                    if inspect.isfunction(v) and (not m.startswith("_") or m in _DUNDERS) and v.__module__.startswith("torpor"):
                        fns.append((f"{name}.{m}", v))
            for what, f in fns:
                with self.subTest(what):
                    hints = typing.get_type_hints(f, localns=vars(torpor))  # names imported for type checkers only
                    params = [p for p in inspect.signature(f).parameters if p not in ("self", "cls")]
                    self.assertEqual([p for p in params if p not in hints], [], "parameters without a type")
                    self.assertIn("return", hints)
        self.assertTrue((ROOT / "src" / "torpor" / "py.typed").exists())

    def test_listing(self) -> None:
        # The listing is made from the code: each kind of name shows.
        src = '''
from __future__ import annotations
import dataclasses, enum
__all__ = ["K", "M", "E", "D", "C", "f"]
K = 3
M = {"a": int}
class E(enum.StrEnum):
    A = "a"
@dataclasses.dataclass
class D:
    x: int = 1
    y: list[str] = dataclasses.field(default_factory=list)
    def m(self, z: str, *, k: int | None = None) -> D: ...
    @classmethod
    def make(cls, v: object) -> D: ...
class C(Exception):
    code: str
    def __init__(self, code: str) -> None: ...
    def _hidden(self) -> None: ...
def f(a: int, b: str = "s") -> bool: ...
def g() -> None: ...
'''
        mod = types.ModuleType("fake")
        sys.modules["fake"] = mod  # dataclasses looks its module up
        self.addCleanup(sys.modules.pop, "fake")
        exec(src, mod.__dict__)
        self.assertEqual(listing(mod), sorted([
            "class C(Exception)",
            "attr C.code: str",
            "method C.__init__(code: str) -> None",
            "class D(object)",
            "field D.x: int = 1",
            "field D.y: list[str] = list()",
            "method D.m(z: str, *, k: int | None = None) -> D",
            "classmethod D.make(v: object) -> D",
            "class E(enum.StrEnum)",
            "member E.A = 'a'",
            "const K = 3",
            "const M = {'a': int}",
            "def f(a: int, b: str = 's') -> bool",
        ]))


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        API_TXT.write_text("# The exported API of the torpor package, one line a name (tests/test_api.py): it only grows.\n"
                           + "\n".join(listing(torpor)) + "\n")
        print(f"wrote {API_TXT}")
    else:
        unittest.main()
