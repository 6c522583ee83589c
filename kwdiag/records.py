"""``record``: kwdiag's internal data classes, made as ``dataclasses.dataclass`` makes them, compiling only one method.

Why: ``dataclass`` compiles every method it writes on its own, ~0.7 ms a class on this kind of machine, and an
``explain`` of a one-line log imports 22 of them: ~16 ms of its ~130 ms start (issue 21 asks for 120). ``record``
compiles only ``__init__`` (the one method whose speed matters: records are made per line and per death) and
makes the others as closures over the field names (~0.25 ms a class). Only the internal classes use it; the
public result types (``Death``, ``Evidence``, ``Report``, ``Event``, ...) stay real dataclasses, since a user
may call ``dataclasses.asdict`` or ``replace`` on them.

Covers: the fields of the class's own annotations, in order; defaults, and ``dataclasses.field`` with
``default``, ``default_factory`` and ``repr``; ``__init__``, ``__repr__``; ``eq`` (``__eq__`` over the fields
for the same class, and, as ``dataclass`` does, ``__hash__`` over them when frozen, none when not); ``frozen``
(assigning raises ``dataclasses.FrozenInstanceError``). Does not cover: inheritance between records, ``slots``,
``order``, ``kw_only``, ``InitVar``/``ClassVar``, ``__post_init__`` (a class that needs one stays a dataclass);
a class with ``__post_init__``, ``__slots__`` or a record among its bases is refused with TypeError.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, FrozenInstanceError
from operator import attrgetter
from typing import Any, Callable, TypeVar

T = TypeVar("T", bound=type)


def record(cls: T | None = None, /, *, frozen: bool = False, eq: bool = True) -> Any:
    """``@record`` or ``@record(frozen=True)`` / ``@record(eq=False)``: see the module's docstring."""
    def wrap(c: T) -> T:
        return _make(c, frozen=frozen, eq=eq)
    return wrap if cls is None else wrap(cls)


def _make(cls: T, *, frozen: bool, eq: bool) -> T:
    own = cls.__dict__
    if "__post_init__" in own or "__slots__" in own or any(hasattr(b, "__record_fields__") for b in cls.__mro__[1:]):
        raise TypeError(f"{cls.__qualname__}: record covers plain classes only (see kwdiag.records)")
    # own annotations (read through the attribute when the class dict has none: Python 3.14 makes them lazily)
    names = list(own["__annotations__"] if "__annotations__" in own else getattr(cls, "__annotations__", {}))
    env: dict[str, Any] = {"MISSING": MISSING, "FrozenInstanceError": FrozenInstanceError, "cls": cls,
                           "_set": object.__setattr__}
    params, body, shown = [], [], []
    for name in names:
        default, factory, show = _default_of(own.get(name, MISSING))
        if factory is not MISSING:
            env[f"_factory_{name}"] = factory
            params.append(f"{name}=MISSING")
            value = f"_factory_{name}() if {name} is MISSING else {name}"
        elif default is not MISSING:
            env[f"_default_{name}"] = default
            params.append(f"{name}=_default_{name}")
            value = name
        else:
            if len(params) != len([p for p in params if "=" not in p]):
                raise TypeError(f"{cls.__qualname__}: non-default field {name!r} follows a default one")
            params.append(name)
            value = name
        body.append(f"    _set(self, {name!r}, {value})" if frozen else f"    self.{name} = {value}")
        if show:
            shown.append(name)
        if name in own:   # the default lives in __init__ now, as with dataclass (the class attribute stays for
            if isinstance(own[name], Field):   # plain values, and a Field is removed)
                delattr(cls, name)
    made: dict[str, Callable] = {}
    exec("\n".join([f"def __init__(self{', ' if params else ''}{', '.join(params)}):", *(body or ["    pass"])]),
         env, made)   # noqa: S102  (our own source, built above from the class's field names)
    made.update(_methods(tuple(names), tuple(shown), frozen=frozen, eq=eq))
    for method_name, function in made.items():
        function.__qualname__ = f"{cls.__qualname__}.{method_name}"
        setattr(cls, method_name, function)
    if eq and not frozen:
        cls.__hash__ = None   # type: ignore[assignment]  # mutable and compared by value: unhashable, as dataclass
    cls.__record_fields__ = tuple(names)   # type: ignore[attr-defined]
    return cls


def _methods(names: tuple[str, ...], shown: tuple[str, ...], *, frozen: bool, eq: bool) -> dict[str, Callable]:
    """``__repr__``, ``__eq__``, ``__hash__`` and the frozen guards, as closures over the field names: only
    ``__init__`` is compiled (an ``exec`` is most of a class's making), the rest read the fields with
    ``attrgetter``, in C."""
    values = attrgetter(*names) if len(names) > 1 else (lambda obj: (getattr(obj, names[0]),) if names else ())
    shown_values = attrgetter(*shown) if len(shown) > 1 else (lambda obj: (getattr(obj, shown[0]),) if shown else ())

    def __repr__(self: Any) -> str:
        return f"{self.__class__.__qualname__}(" + ", ".join(
            f"{n}={v!r}" for n, v in zip(shown, shown_values(self))) + ")"

    out: dict[str, Callable] = {"__repr__": __repr__}
    if eq:
        def __eq__(self: Any, other: Any) -> Any:
            if other.__class__ is self.__class__:
                return values(self) == values(other)
            return NotImplemented
        out["__eq__"] = __eq__
        if frozen:
            def __hash__(self: Any) -> int:
                return hash(values(self))
            out["__hash__"] = __hash__
    if frozen:
        def __setattr__(self: Any, name: str, value: Any) -> None:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self: Any, name: str) -> None:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        out["__setattr__"], out["__delattr__"] = __setattr__, __delattr__
    return out


def _default_of(value: Any) -> tuple[Any, Any, bool]:
    """(default, default factory, shown in repr) of a field whose class attribute is ``value``."""
    if isinstance(value, Field):
        if not value.init or not value.compare or value.hash is not None or value.kw_only not in (MISSING, False) \
                or value.metadata:
            raise TypeError(f"record covers field(default=, default_factory=, repr=) only, not {value!r}")
        return value.default, value.default_factory, bool(value.repr)
    return value, MISSING, True
