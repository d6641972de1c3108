"""A transition buffer's one-call adder of the usual step, compiled per buffer.

An env loop adds one step per env step, and each add of the usual step (arrays of the
stored dtypes and shapes, the observation the previous step's next observation) is a
handful of byte copies wrapped in Python. In a training loop every call frame and
attribute read between the caller and those copies runs with cold caches, at several
times its cost in a loop of adds: through an adapter, the usual step took four calls
(the adapter's, the buffer's single or vector add, its shortcut, the fused writer).
:func:`build_step_adder` builds, once per buffer, one function that does the whole
usual step, with the buffer's parts bound as constants: the checks, the lock, the
comparison with the previous next observation, the write and the bookkeeping of
:meth:`~replaybuffer.buffers.transition_add.TransitionAdds._add_exact`. Like
:mod:`replaybuffer.storage.exact_writer` it is built from source text, since the
specialisation is the speed-up: branches decided once, no loops.

Where every leaf is a field of the storage's records (numpy storage of small leaves,
:func:`~replaybuffer.storage.exact_writer.record_layout`), the write is inlined: one
env's step is its record's bytes joined (flags from Python bools, the reward packed
from a Python float as the fused writer packs it) and copied in one slice assignment;
several envs' steps are assembled in a scratch block of records and copied in one.
Elsewhere the adder calls the storage's fused writer.

Anything else (another type, dtype or shape, an observation that does not follow on,
a rate limiter, a save in progress, a discrete action outside its range, a reward
that overflows float32) goes, with the arguments as they came and nothing written, to
the ``fallback`` given, which handles or refuses it as the buffer's methods do. The
fallback runs outside the buffer's lock.
"""

from __future__ import annotations

import builtins
import keyword
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from replaybuffer.storage.exact_writer import BLOCK_MAX

CORE_NAMES = ("observation", "action", "reward", "next_observation", "terminated",
              "truncated")
"""The argument names of a transition buffer's add, in order."""

POLICY_NAMES = ("value", "log_prob")
"""A rollout's two more arguments, after :data:`CORE_NAMES`."""

_FLOAT32, _FLOAT64, _BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.bool_)


@dataclass(frozen=True)
class AdderParts:
    """What :func:`build_step_adder` binds (gathered by
    :meth:`~replaybuffer.buffers.transition_add.TransitionAdds.step_adder`).

    Attributes:
        buffer: the buffer; the adder reads its state that changes (the rate limiter,
            a save's pause of the fused writer, the cached bytes of the newest next
            observation) on every call, as its methods do, and calls its methods for
            the rare steps (a released side observation, an episode end, hooks).
        names: the arguments' names (:data:`CORE_NAMES`, then :data:`POLICY_NAMES` for
            a rollout), as the caller's users pass them by keyword.
        single: one env's step without the env axis (``num_envs`` 1); else every leaf
            has the env axis first.
        policy: a rollout's step (value and log-probability after the action).
        specs: the stored specs, by storage leaf.
        order: the storage leaf of each leaf in add order (observation, action, [value,
            log_prob,] reward, terminated, truncated).
        write: the fused writer taking the leaves in add order (without the env axis
            when ``single``).
        records: the storage's records and ``(byte offset, storage leaf)`` of their
            fields (:func:`~replaybuffer.storage.exact_writer.record_layout`) where
            every leaf is one, else ``None``.
        ring, lock, head, head_bytes, owns: the buffer's ring, lock, newest next
            observation ``[num_envs, *shape]`` (one leaf), its bytes (a memoryview) and
            its per-slot side-store flags.
        no_flag: false flags as the writer takes them (bool ``()`` or ``[num_envs]``).
        ranges: ``(index in add order, low, high)`` of each discrete leaf's range.
        tracks_adds, written_hook: whether the sampler's ``on_add`` and the buffer's
            ``_written`` must see every add.
        fallback: takes every step the adder does not.
    """

    buffer: Any
    names: tuple[str, ...]
    single: bool
    policy: bool
    specs: Sequence[Any]
    order: Sequence[int]
    write: Callable[[int, Sequence[Any]], bool]
    records: tuple[np.ndarray, list[tuple[int, int]]] | None
    ring: Any
    lock: Any
    head: np.ndarray
    head_bytes: memoryview
    owns: bytearray
    no_flag: Any
    ranges: Sequence[tuple[int, int, int]]
    tracks_adds: bool
    written_hook: bool
    fallback: Callable[..., Any]


_RESERVED = re.compile(r"(?:[qxrds]\d+|pad\d+|step_id|written|slot|start|at|raw|ended|"
                       r"record|self|ring|lock|head|head_bytes|owns|L|B|no_ends|"
                       r"ndarray|fallback|float64|float32|bool_|f32|f64|b0|b1|write|"
                       r"no_flag|zero|pack|zero4|flags|records|block|given)")
"""The names the adder's source binds or assigns: no argument may take one."""


def argument_names(names: Sequence[str] | None, policy: bool) -> tuple[str, ...]:
    """The adder's argument names: ``names`` checked (as many as :data:`CORE_NAMES`,
    and :data:`POLICY_NAMES` for a rollout; distinct identifiers, none of the names its
    source uses itself), or those defaults.

    Raises:
        ValueError: naming ``names``, what was expected and what came.
    """
    expected = CORE_NAMES + (POLICY_NAMES if policy else ())
    if names is None:
        return expected
    got = tuple(names)
    if len(got) != len(expected) or len(set(got)) != len(got) or not all(
            isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n)
            and not _RESERVED.fullmatch(n) and n not in vars(builtins) for n in got):
        raise ValueError(f"names: expected {len(expected)} distinct argument names (as "
                         f"{expected}), none a Python keyword, a builtin or a name the "
                         f"adder's source uses itself (such as 'self', 'head', 'q0'), got "
                         f"{got!r}")
    return got


def build_step_adder(parts: AdderParts) -> Callable[..., Any]:
    """The adder of ``parts`` (see the module): ``add(*names)``, the truncation flag
    and the policy's arguments defaulting to ``None``; returns ``None`` having added
    the usual step, else what ``fallback`` returns."""
    source, bound = _Source(parts).build()
    exec(compile(source, f"<step_adder {type(parts.buffer).__name__}>", "exec"), bound)
    # Out of its own globals: there it would make a reference cycle (the function, its
    # globals), and the buffer they bind would wait for the garbage collector.
    adder: Callable[..., Any] = bound.pop("add")
    return adder


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


class _Source:
    """The adder's source text and the names it binds, for one buffer's parts."""

    def __init__(self, parts: AdderParts):
        self.parts = parts
        names = parts.names
        # The argument behind each leaf in add order, and its kind.
        fields = [names[0], names[1]] + (list(names[6:8]) if parts.policy else []) + \
            [names[2], names[4], names[5]]
        kinds = ["array", "array"] + ["float"] * (2 if parts.policy else 0) + \
            ["float", "flag", "flag"]
        self.fields, self.kinds = fields, kinds
        self.defaults = set(fields[2:4] if parts.policy else []) | {names[5]}
        self.passed = ", ".join(names)
        self.refuse = f"return fallback({self.passed})"
        head = parts.head
        B = parts.ring.batch_size
        self.bound: dict[str, Any] = {
            "self": parts.buffer, "ring": parts.ring, "lock": parts.lock, "head": head,
            "head_bytes": parts.head_bytes, "owns": parts.owns,
            "L": parts.ring.max_length, "B": B, "no_ends": bytes(B),
            "ndarray": np.ndarray, "fallback": parts.fallback, "float64": np.float64,
            "float32": np.float32, "bool_": np.bool_, "f32": _FLOAT32, "f64": _FLOAT64,
            "b0": b"\x00", "b1": b"\x01", "write": parts.write, "no_flag": parts.no_flag,
            "zero": 0.0 if parts.single else _read_only(np.zeros(B, np.float32)),
            "pack": struct.Struct("=f").pack, "zero4": bytes(4),
            "flags": (np.array(False), np.array(True))}
        outer = () if parts.single else (B,)
        for k, leaf in enumerate(parts.order):
            spec = parts.specs[leaf]
            self.bound[f"d{k}"], self.bound[f"s{k}"] = spec.dtype, outer + spec.shape
            fixed = {"float": _FLOAT32, "flag": _BOOL}.get(kinds[k])
            if fixed is not None and (spec.dtype != fixed or spec.shape != ()):
                raise ValueError(f"step_adder: leaf {k} ({fields[k]}) is stored as "
                                 f"{spec.dtype}{spec.shape}, not {fixed} ()")
        self.inline = parts.records is not None and (
            parts.single or B * parts.records[0].itemsize <= BLOCK_MAX)

    def build(self) -> tuple[str, dict[str, Any]]:
        p = self.parts
        obs, act, nxt = self.fields[0], self.fields[1], p.names[3]
        params = list(p.names[:5]) + [f"{n}=None" for n in p.names[5:]]
        lines = [f"def add({', '.join(params)}):",
                 # The arrays first: the comparison and the bookkeeping read them.
                 f"    if (type({nxt}) is not ndarray or {nxt}.dtype is not d0 or "
                 f"{nxt}.shape != s0",
                 f"            or {self._array_fails(0, obs)}",
                 f"            or {self._array_fails(1, act)}",
                 "            or self._limiter is not None):",
                 f"        {self.refuse}"]
        if self.inline and p.single:
            lines += self._single_record()
        elif self.inline:
            lines += self._block_prepare()
        else:
            lines += self._writer_prepare()
        lines += self._ranges()
        lines += [
            "    lock.acquire()  # not `with`: its __exit__ call costs more than release()",
            "    try:",
            "        step_id = ring.last_id + 1",
            "        if self._write_exact is None:  # paused while a save's snapshot is open",
            "            written = False",
            f"        elif step_id and {self._observation_bytes()} != (head.tobytes() if "
            "(raw := self._head_raw) is None else raw):",
            "            written = False  # not the previous next observation",
            "        else:",
            "            slot = step_id % L",
            "            start = slot * B"]
        lines += ["            " + line for line in self._store()]
        # Written: the general path's bookkeeping (the fused writer's call may refuse).
        done = [
            "if owns[slot]:  # the overwritten step releases its side observations",
            "    self._release(start, slot)",
            "ended = None",
            f"if {self._ends()}:",
            f"    ended = self._keep_ended(step_id, start, slot, {self._flags()}, ({nxt},))",
            f"raw = {nxt}.tobytes()",
            "head_bytes[:] = raw",
            "self._head_raw = raw",
            "ring.last_id = step_id"]
        if p.tracks_adds:
            done.append("self._sampler.on_add(ring, step_id, 1)")
        if p.written_hook:
            done.append("self._written(start, ended)")
        indent = "            " if self.inline else "                "
        if not self.inline:
            lines.append("            if written:")
        lines += [indent + line for line in done]
        lines += ["    finally:", "        lock.release()", "    if not written:",
                  f"        {self.refuse}"]
        return "\n".join(lines), self.bound

    def _array_fails(self, k: int, name: str) -> str:
        return f"type({name}) is not ndarray or {name}.dtype is not d{k} or " \
            f"{name}.shape != s{k}"

    # ------------------------------------------------------------ one env, inlined
    def _single_record(self) -> list[str]:
        """One env's leaves as bytes ``q{k}`` (before the lock: nothing shared), then
        the record joined in offset order with its zero padding."""
        lines = []
        for k, (name, kind) in enumerate(zip(self.fields, self.kinds)):
            default = name in self.defaults
            if kind == "array":
                lines.append(f"    q{k} = {name}.tobytes()")
            elif kind == "flag":
                lines += [f"    if {name} is False{f' or {name} is None' if default else ''}:",
                          f"        q{k} = b0",
                          f"    elif {name} is True:", f"        q{k} = b1",
                          f"    elif type({name}) is bool_:",
                          f"        q{k} = b1 if {name} else b0",
                          "    else:", f"        {self.refuse}"]
            else:  # float32 (): packed from Python floats as the fused writer packs them
                first = "if"
                if default:
                    lines += [f"    if {name} is None:", f"        q{k} = zero4"]
                    first = "elif"
                lines += [f"    {first} type({name}) is float or type({name}) is float64:",
                          "        try:", f"            q{k} = pack({name})",
                          "        except OverflowError:  # numpy's cast gives inf: the "
                          "fallback casts", f"            {self.refuse}",
                          f"    elif type({name}) is float32:",
                          f"        q{k} = {name}.tobytes()",
                          "    else:", f"        {self.refuse}"]
        base, fields = self.parts.records or (None, [])
        assert base is not None
        at_leaf = {leaf: k for k, leaf in enumerate(self.parts.order)}
        pieces, end = [], 0
        for offset, leaf in fields:
            if offset > end:
                self.bound[f"pad{end}"] = bytes(offset - end)
                pieces.append(f"pad{end}")
            pieces.append(f"q{at_leaf[leaf]}")
            spec = self.parts.specs[leaf]
            end = offset + spec.nbytes
        if end < base.itemsize:
            self.bound[f"pad{end}"] = bytes(base.itemsize - end)
            pieces.append(f"pad{end}")
        self.bound["records"] = base.view(np.uint8).data
        self.size = base.itemsize
        return lines + [f"    record = b''.join(({', '.join(pieces)},))"]

    # ------------------------------------------------------------ several envs, inlined
    def _block_prepare(self) -> list[str]:
        """The checks of the leaves with the env axis; a scratch block of records
        whose field views (``r{k}``) take them under the lock."""
        base, fields = self.parts.records or (None, [])
        assert base is not None
        B = self.parts.ring.batch_size
        scratch = np.zeros(B, base.dtype)  # its padding stays zero
        names = {field[1]: name for name, field in (base.dtype.fields or {}).items()}
        at_leaf = {leaf: k for k, leaf in enumerate(self.parts.order)}
        for offset, leaf in fields:
            self.bound[f"r{at_leaf[leaf]}"] = scratch[names[offset]]
        self.bound["records"], self.bound["block"] = \
            base.view(np.uint8).data, scratch.view(np.uint8).data
        self.size = base.itemsize
        # Defaulted leaves (truncation, the policy's) are written only when given or
        # when the scratch holds a given value: `given[k]`.
        self.bound["given"] = [True] * len(self.fields)
        lines = []
        checks = []
        for k, (name, kind) in enumerate(zip(self.fields, self.kinds)):
            if kind == "array":
                continue
            dtypes = f"{name}.dtype is f32 or {name}.dtype is f64" if kind == "float" \
                else f"{name}.dtype is d{k}"
            check = f"(type({name}) is ndarray and ({dtypes}) and {name}.shape == s{k})"
            if name in self.defaults:
                check = f"({name} is None or {check})"
            checks.append(check)
        lines += ["    if not (" + "\n            and ".join(checks) + "):",
                  f"        {self.refuse}"]
        return lines

    # ------------------------------------------------------------ the fused writer
    def _writer_prepare(self) -> list[str]:
        """The leaves as the fused writer takes them (``x{k}``): one env's Python bool
        flags as 0-d arrays, a float64 reward scalar as a Python float, the defaults."""
        lines = []
        for k, (name, kind) in enumerate(zip(self.fields, self.kinds)):
            default = name in self.defaults
            if kind == "flag" and self.parts.single:
                value = f"flags[{name}] if type({name}) is bool else {name}"
            elif kind == "float" and self.parts.single:
                value = f"float({name}) if type({name}) is float64 else {name}"
            else:
                value = name
            if default:
                value = f"({'no_flag' if kind == 'flag' else 'zero'} if {name} is None " \
                    f"else {value})"
            lines.append(f"    x{k} = {value}")
        return lines

    def _ranges(self) -> list[str]:
        """Discrete leaves inside their ranges (ints: literals), else the fallback."""
        lines = []
        for k, low, high in self.parts.ranges:
            x = self.fields[k]
            lines += [f"    if type({x}) is not ndarray or {x}.dtype.kind not in 'iu' or (",
                      f"            not {low} <= {x}.item() <= {high} if {x}.size == 1 else",
                      f"            {x}.min() < {low} or {x}.max() > {high}):",
                      f"        {self.refuse}"]
        return lines

    def _store(self) -> list[str]:
        """The write under the lock; sets ``written``."""
        if self.inline and self.parts.single:
            return [f"at = start * {self.size}", f"records[at:at + {self.size}] = record",
                    "written = True"]
        if self.inline:
            lines = []
            for k, name in enumerate(self.fields):
                if name in self.defaults:
                    value = "no_flag" if self.kinds[k] == "flag" else "zero"
                    lines += [f"if {name} is not None:",
                              f"    r{k}[...] = {name}", f"    given[{k}] = True",
                              f"elif given[{k}]:",
                              f"    r{k}[...] = {value}", f"    given[{k}] = False"]
                else:
                    lines.append(f"r{k}[...] = {name}")
            n = self.size * self.parts.ring.batch_size
            return lines + [f"at = start * {self.size}", f"records[at:at + {n}] = block",
                            "written = True"]
        leaves = ", ".join(f"x{k}" for k in range(len(self.fields)))
        return [f"written = write(start, ({leaves},))"]

    def _observation_bytes(self) -> str:
        """The observation's bytes (computed for the record already where inlined)."""
        return "q0" if self.inline and self.parts.single else f"{self.fields[0]}.tobytes()"

    def _ends(self) -> str:
        """Whether the step ends an episode in some row."""
        t, u = len(self.fields) - 2, len(self.fields) - 1
        if self.inline and self.parts.single:
            return f"q{t} is b1 or q{u} is b1"
        if self.inline:
            term, trunc = self.fields[t], self.fields[u]
            return f"{term}.tobytes() != no_ends or " \
                f"({trunc} is not None and {trunc}.tobytes() != no_ends)"
        return f"x{t}.tobytes() != no_ends or x{u}.tobytes() != no_ends"

    def _flags(self) -> str:
        """terminated, truncated as :meth:`_keep_ended` takes them."""
        t, u = len(self.fields) - 2, len(self.fields) - 1
        if self.inline and self.parts.single:
            return f"flags[q{t} is b1], flags[q{u} is b1]"
        if self.inline:
            trunc = self.fields[u]
            return f"{self.fields[t]}, (no_flag if {trunc} is None else {trunc})"
        return f"x{t}, x{u}"
