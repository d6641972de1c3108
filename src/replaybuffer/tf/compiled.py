"""Graph functions for the TensorFlow buffer: traced once, called eagerly without
``tf.function``'s dispatch, and errors that leave AutoGraph as they are."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import tensorflow as tf

from replaybuffer.errors import ReplayBufferError

F = TypeVar("F", bound=Callable[..., Any])


def plain_errors(method: F) -> F:
    """Let this library's errors leave a ``tf.function`` as they are.

    AutoGraph re-raises an exception from converted code as a ``StagingError`` unless
    it is one of a few built-in types or carries ``ag_pass_through``; a ``SpecError``
    must reach the caller as a ``SpecError``. The buffer's methods hold no Python
    control flow on tensors, so AutoGraph has nothing to convert in them.
    """
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except (ReplayBufferError, ValueError) as exc:
            exc.ag_pass_through = True  # type: ignore[union-attr]  # AutoGraph's marker
            raise
    # do_not_convert (untyped, like all of TensorFlow) keeps method's signature.
    unconverted: F = tf.autograph.experimental.do_not_convert(wrapper)
    return unconverted


class CompiledFunction:
    """``fn`` as a ``tf.function`` for ``signature``, traced on its first eager call.

    Eager calls go straight to the traced concrete function: that skips
    ``tf.function``'s dispatch (about a third of an eager call's cost), and tracing
    outside ``tf.function.__call__`` keeps TensorFlow from warning about "frequent
    retracing" when a program builds several buffers (each traces the same code once).

    Called while a graph is being built (the user's ``tf.function``, a ``tf.data``
    function), ``fn`` builds its ops in that graph, as TF-Agents' buffer does: a call of
    the nested function made ``add_batch`` inside ``tf.function`` 2-4% slower (about
    10 us a call, in 40 interleaved rounds of 200 calls against building in place).

    Args:
        fn: builds the graph; takes tensors matching ``signature`` and returns a nest
            of tensors.
        signature: ``tf.TensorSpec`` s of ``fn``'s arguments (``[]``: none).
    """

    __slots__ = ("_fn", "_function", "_concrete")

    def __init__(self, fn: Callable[..., Any], signature: list[Any]):
        self._fn = fn
        self._function = tf.function(fn, input_signature=signature, autograph=False)
        self._concrete: Any = None

    def __call__(self, *args: Any) -> Any:
        if not tf.executing_eagerly():
            return self._fn(*args)
        concrete = self._concrete
        if concrete is None:
            concrete = self._concrete = self._function.get_concrete_function()
        return concrete(*args)
