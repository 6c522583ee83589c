"""``kwdiag.records.record`` makes a class as ``dataclasses.dataclass`` would: each check runs on both and compares."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from kwdiag.records import record


def _pair(frozen: bool = False, eq: bool = True):
    """The same class body made by ``dataclass`` and by ``record``."""
    def body(decorate):
        @decorate
        class Point:
            x: int
            y: int = 0
            tags: list = field(default_factory=list)
            note: str | None = field(default=None, repr=False)
        return Point
    return body(dataclass(frozen=frozen, eq=eq)), body(record(frozen=frozen, eq=eq))


@pytest.mark.parametrize("frozen", [False, True])
def test_init_defaults_repr_and_equality_are_dataclass_s(frozen):
    for cls in _pair(frozen=frozen):
        a, b = cls(1), cls(1)
        assert (a.x, a.y, a.tags, a.note) == (1, 0, [], None)
        assert a.tags is not b.tags                       # a factory per instance
        assert a == b and a != cls(2) and a != (1, 0, [], None)
        assert repr(cls(1, 2, ["t"], "hidden")) == f"{cls.__qualname__}(x=1, y=2, tags=['t'])"
    plain, rec = _pair(frozen=frozen)
    assert repr(plain(3, 4)).split("(", 1)[1] == repr(rec(3, 4)).split("(", 1)[1]
    assert (plain(1) == rec(1)) is False                  # another class: not equal, as between two dataclasses


def test_frozen_cannot_be_assigned_and_hashes_by_value():
    for cls in _pair(frozen=True):
        p = cls(1, tags=())
        with pytest.raises(FrozenInstanceError):
            p.x = 2
        with pytest.raises(FrozenInstanceError):
            del p.y
        assert hash(p) == hash(cls(1, tags=())) and len({p, cls(1, tags=())}) == 1


def test_mutable_is_unhashable_and_eq_false_keeps_identity():
    for cls in _pair(frozen=False):
        p = cls(1)
        p.x = 5
        assert p.x == 5
        with pytest.raises(TypeError):
            hash(p)
    for cls in _pair(eq=False):
        assert cls(1) != cls(1) and len({cls(1), cls(1)}) == 2


@pytest.mark.parametrize("frozen", [False, True])
def test_pickles(frozen):
    _, cls = _pair(frozen=frozen)
    globals()["_Pickled"] = cls                            # pickle finds a class by its module and name
    cls.__qualname__ = cls.__name__ = "_Pickled"
    p = cls(1, 2, ["a"], "n")
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.note == "n"


def test_what_it_does_not_cover_is_refused():
    with pytest.raises(TypeError, match="non-default field 'y' follows"):
        @record
        class Bad:
            x: int = 0
            y: int

    with pytest.raises(TypeError, match="not Field"):
        @record
        class Hidden:
            x: int = field(default=0, compare=False)

    with pytest.raises(TypeError, match="plain classes only"):
        @record
        class Post:
            x: int

            def __post_init__(self):
                pass
