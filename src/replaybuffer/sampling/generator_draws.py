"""A numpy generator's ``random()`` numbers drawn inside a compiled kernel, bit for bit.

``rng.random(n)`` (float64 in ``[0, 1)``) fills its output by calling the bit
generator's C function ``next_double(state)`` once per number, under the bit
generator's lock. Numpy publishes both through ``rng.bit_generator.ctypes``: the
function's address and the state's. A kernel given those two integers calls the same
function on the same state (:func:`next_double`, a numba intrinsic: one indirect call,
no Python), so the ``k``-th number it draws is the ``k``-th ``rng.random(n)`` would
have given, and the generator's state afterwards (its state dict, what a checkpoint
saves) is the one ``rng.random(n)`` leaves (``tests/test_generator_draws.py``). A prioritized draw then takes its random
numbers inside its one compiled call (:mod:`~replaybuffer.sampling.fused_descent`,
:mod:`~replaybuffer.sampling.fused_rejection`), where the numpy call cost about a
microsecond for 256 numbers beyond drawing them. Unboxing a numba ``Generator``
instead cost several microseconds per call.

:func:`bit_source` gives the two addresses for numpy's own bit generators (their
``next_double`` is one C function per class, so its address is read once per class);
for any other bit generator it gives ``None`` and the caller draws with
``rng.random``. ``rng.random`` also takes ``rng.bit_generator.lock``, and so do the
kernels' callers around the call (about 0.1 us): a buffer's lock covers its own
sampler's generator, but a generator given to ``draw(rng=...)`` may be shared by
threads drawing from other buffers, or with ``rng.random`` itself.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from replaybuffer.sampling import tree_kernels

#: Bit generator classes whose ``next_double`` is a fixed C function of the class (so
#: one address serves every instance). Others (third-party ones) take ``rng.random``.
NUMPY_BIT_GENERATORS = (np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
                        np.random.Philox, np.random.SFC64)

#: What a kernel is given for "no bit generator: the draws are in the array given".
NO_SOURCE = (0, 0)

_function_of: dict[type, int] = {}


def bit_source(rng: np.random.Generator) -> tuple[int, int] | None:
    """``(next_double's address, the state's address)`` of ``rng``'s bit generator for
    :func:`next_double`, when numba is present and it is one of numpy's own
    (:data:`NUMPY_BIT_GENERATORS`); else ``None``."""
    bit_generator = rng.bit_generator
    kind = type(bit_generator)
    function = _function_of.get(kind)
    if function is None:
        if kind not in NUMPY_BIT_GENERATORS or not tree_kernels.AVAILABLE:
            return None
        function = _function_of[kind] = _address(bit_generator.ctypes.next_double)
    return function, bit_generator.ctypes.state_address


def _address(function: Any) -> int:
    """The address (an int) of a ctypes function pointer."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    if not address:  # pragma: no cover - numpy always fills it
        raise RuntimeError("the bit generator has no next_double")
    return int(address)


def _compiled_next_double() -> Any:
    """The numba intrinsic behind :data:`next_double`."""
    from llvmlite import ir  # type: ignore[import-untyped]  # (numba's own dependency)
    from numba import types
    from numba.extending import intrinsic

    def next_double(typingctx: Any, function: Any, state: Any) -> Any:
        signature = types.float64(types.intp, types.intp)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            pointer = ir.IntType(8).as_pointer()
            kind = ir.FunctionType(ir.DoubleType(), [pointer])
            callee = builder.inttoptr(args[0], kind.as_pointer())
            return builder.call(callee, [builder.inttoptr(args[1], pointer)])

        return signature, codegen

    return intrinsic(next_double)


def _no_next_double(function: int, state: int) -> float:  # pragma: no cover
    raise RuntimeError("next_double needs numba")


#: ``next_double(function, state)``, in compiled code only: the float64 in ``[0, 1)``
#: that the bit generator at ``state`` (an address) gives next, from its C
#: ``next_double`` at ``function`` (an address): :func:`bit_source`'s pair.
next_double: Any = _compiled_next_double() if tree_kernels.AVAILABLE else _no_next_double


@tree_kernels.compile_kernel
def random_into(function: int, state: int, out: np.ndarray) -> None:
    """``out[:] = rng.random(len(out))`` (float64 ``[N]``) from :func:`bit_source`'s
    pair, the generator advanced as ``rng.random`` advances it."""
    for k in range(out.shape[0]):
        out[k] = next_double(function, state)
