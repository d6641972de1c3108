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

from operator import attrgetter
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


class CheckChoice(property):
    """A ``bool | None`` attribute ``name`` of a sampler class, checked at every
    assignment.

    Read on a sampler, it is that sampler's own value where one was set, else the
    class's default (``default``). The value lives in ``_<name>_choice`` (the
    sampler's, else the class's), read by a C getter: a read costs what a plain
    attribute's does, as the update path reads ``device_updates`` at every call.
    """

    def __init__(self, name: str, default: bool | None = None) -> None:
        self.slot = f"_{name}_choice"
        self.default = checked_choice(name, default)
        self.choice_name = name
        super().__init__(attrgetter(self.slot), self._assign)

    def __set_name__(self, owner: type, name: str) -> None:
        type.__setattr__(owner, self.slot, self.default)

    def _assign(self, obj: object, value: bool | None) -> None:
        obj.__dict__[self.slot] = checked_choice(self.choice_name, value)


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
    (a plain assignment would replace the property, and with it every later check)."""

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]):
        super().__init__(name, bases, namespace)
        for attr, value in namespace.items():
            choice = _inherited_choice(cls.__mro__[1:], attr)
            if choice is not None and not isinstance(value, CheckChoice):
                type.__delattr__(cls, attr)  # the inherited property reads the default
                type.__setattr__(cls, choice.slot, checked_choice(attr, value))

    def __setattr__(cls, name: str, value: Any) -> None:
        choice = _inherited_choice(cls.__mro__, name)
        if choice is not None and not isinstance(value, CheckChoice):
            type.__setattr__(cls, choice.slot, checked_choice(name, value))
            return
        super().__setattr__(name, value)
