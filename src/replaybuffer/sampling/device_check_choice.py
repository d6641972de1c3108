"""Where a device sampler checks something: ``True``, ``False`` or ``None``.

A device prioritized sampler has two such choices (``device_updates``,
``draw_checks_on_device``: :class:`~replaybuffer.sampling.torch_prioritized.
TorchPrioritizedSampler`): ``True`` checks on the device and reports at a later call,
``False`` checks on the host at once, ``None`` (the default) lets the device decide
(CUDA defers). Each is read only on a path that may never run (a draw after a zero was
stored, an update given as device tensors), so a bad value checked there would be
found late, or never. :class:`CheckChoice` refuses it where it is set instead: on one
sampler, on the class (every sampler's default; :class:`ChoosesChecks`), or in a
subclass's body, with a ``ValueError`` naming the choice, what it takes and what came,
the value before left in place.
"""

from __future__ import annotations

from typing import Any


def checked_choice(name: str, value: object) -> bool | None:
    """``value`` when it is ``True``, ``False`` or ``None``.

    Raises:
        ValueError: anything else (``1``, ``"yes"``, ``numpy.True_``), naming ``name``.
    """
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None (on a CUDA device), got "
                         f"{value!r} (a {type(value).__name__}); it was not changed")
    return value


class CheckChoice:
    """A ``bool | None`` attribute of a sampler class, checked at every assignment.

    Read on the class, it is the default (``default``); read on a sampler, that
    sampler's own value where one was set, else the class's default.
    """

    def __init__(self, default: bool | None = None) -> None:
        self.default = checked_choice("a check choice", default)
        self.name = "a check choice"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object | None, owner: type | None = None) -> bool | None:
        if obj is None:
            return self.default
        value: bool | None = obj.__dict__.get(self.name, self.default)
        return value

    def __set__(self, obj: object, value: bool | None) -> None:
        obj.__dict__[self.name] = checked_choice(self.name, value)


def _inherited_choice(classes: tuple[type, ...], name: str) -> CheckChoice | None:
    """The :class:`CheckChoice` that ``name`` resolves to over ``classes`` (an MRO),
    if it resolves to one."""
    for klass in classes:
        if name in vars(klass):
            found = vars(klass)[name]
            return found if isinstance(found, CheckChoice) else None
    return None


class ChoosesChecks(type):
    """The metaclass of a class with :class:`CheckChoice` attributes: a value given in a
    subclass's body or assigned on a class is checked and becomes that class's default
    (a plain assignment would replace the descriptor, and with it every later check)."""

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]):
        super().__init__(name, bases, namespace)
        for attr, value in namespace.items():
            if not isinstance(value, CheckChoice) and \
                    _inherited_choice(cls.__mro__[1:], attr) is not None:
                setattr(cls, attr, value)  # checked and wrapped by __setattr__

    def __setattr__(cls, name: str, value: Any) -> None:
        own = vars(cls).get(name)
        if isinstance(own, CheckChoice):
            own.default = checked_choice(name, value)
            return
        if not isinstance(value, CheckChoice) and \
                _inherited_choice(cls.__mro__[1:], name) is not None:
            choice = CheckChoice(checked_choice(name, value))
            choice.__set_name__(cls, name)
            value = choice
        super().__setattr__(name, value)
