"""Nests: the one module that talks to optree.

A *nest* is a tree of tuples, lists, dicts and namedtuples whose leaves are
arrays (or specs). ``None`` and empty containers are nodes with no leaves, so a
``Trajectory`` whose ``policy_info`` is ``()`` flattens to six leaves.
Dict keys are visited in sorted order, so two dicts with the same keys in a
different insertion order have the same structure.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import optree

Structure = optree.PyTreeSpec


def flatten(nest: Any) -> tuple[list[Any], Structure]:
    """Return ``(leaves, structure)``; ``structure.unflatten(leaves)`` rebuilds it."""
    return optree.tree_flatten(nest)


def unflatten(structure: Structure, leaves: Sequence[Any]) -> Any:
    """Rebuild a nest of ``structure`` from ``leaves`` (in flatten order)."""
    return structure.unflatten(leaves)


def map_structure(fn: Callable[..., Any], nest: Any, *rest: Any) -> Any:
    """Apply ``fn`` to every leaf (and the matching leaves of ``rest``)."""
    return optree.tree_map(fn, nest, *rest)


def leaf_paths(nest: Any) -> list[str]:
    """Readable paths of the leaves, in flatten order: ``"[1][0]"``, ``"['obs']"``.

    Namedtuple fields are written as attributes (``".observation"``) so that an
    error message can be pasted back into code.
    """
    accessors = optree.tree_accessors(nest)
    return [_format_accessor(a) for a in accessors]


def _format_accessor(accessor: Any) -> str:
    parts = []
    for entry in accessor:
        kind = type(entry).__name__
        if kind in ("NamedTupleEntry", "StructSequenceEntry", "DataclassEntry"):
            parts.append(f".{entry.field}")
        else:
            parts.append(f"[{entry.entry!r}]")
    return "".join(parts) or "<root>"


def contains_lists(nest: Any) -> bool:
    """True when any container in the nest is a Python ``list``.

    Datasets need tuples: a list in a spec is ambiguous between "a container"
    and "a batch" for many consumers (tf.data among them), as TF-Agents warns.
    """
    if type(nest) is list:
        return True
    if optree.tree_is_leaf(nest):
        return False
    children = optree.tree_flatten_one_level(nest)[0]
    return any(contains_lists(child) for child in children)


def fast_flattener(nest: Any) -> Callable[[Any], Sequence[Any] | None] | None:
    """A flatten shortcut for a one-level nest (a dict, tuple or namedtuple of leaves).

    The returned function gives the leaves of a nest with exactly the same keys or
    length as ``nest``, in :func:`flatten` order, and ``None`` for anything else
    (callers then fall back to :func:`flatten`). It skips optree's generic walk,
    which dominates the cost of adding one small step. Returns ``None`` when
    ``nest`` is deeper than one level.
    """
    if optree.tree_is_leaf(nest):
        return None
    children = optree.tree_flatten_one_level(nest)[0]
    if not children or not all(optree.tree_is_leaf(c) for c in children):
        return None
    top = type(nest)
    size = len(children)
    if top is dict:
        try:
            keys = tuple(sorted(nest))
        except TypeError:  # keys of mixed types: leave the ordering to optree
            return None

        # itemgetter takes every key in one C call (a tuple; one key gives one item).
        get = operator.itemgetter(*keys) if size > 1 else lambda d: (d[keys[0]],)

        def from_dict(items: Any) -> Sequence[Any] | None:
            if type(items) is not dict or len(items) != size:
                return None
            try:
                leaves: Sequence[Any] = get(items)
                return leaves
            except KeyError:
                return None
        return from_dict
    if issubclass(top, tuple):
        def from_tuple(items: Any) -> Sequence[Any] | None:
            return items if type(items) is top and len(items) == size else None
        return from_tuple
    return None


def describe(structure: Structure) -> str:
    """A short human description of a structure for error messages."""
    text = repr(structure)
    return text[len("PyTreeSpec("):-1] if text.startswith("PyTreeSpec(") else text
