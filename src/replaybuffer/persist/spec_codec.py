"""A data spec (a nest of :class:`~replaybuffer.specs.ArraySpec`) as JSON, and back.

Containers are encoded by kind (``tuple``, ``list``, ``dict`` with str or int keys,
namedtuple by module and qualified name), leaves by :meth:`ArraySpec.to_dict`.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

from replaybuffer import nest
from replaybuffer.errors import CheckpointError
from replaybuffer.specs import ArraySpec, as_data_spec, spec_from_dict


def encode_spec(spec: Any) -> Any:
    """A JSON-friendly encoding of a nest of :class:`ArraySpec`."""
    if isinstance(spec, ArraySpec):
        return {"spec": spec.to_dict()}
    if spec is None:
        return {"none": True}
    if isinstance(spec, tuple) and hasattr(spec, "_fields"):
        cls = type(spec)
        return {"namedtuple": cls.__qualname__, "module": cls.__module__,
                "fields": list(spec._fields), "values": [encode_spec(v) for v in spec]}
    if type(spec) is tuple:
        return {"tuple": [encode_spec(v) for v in spec]}
    if type(spec) is list:
        return {"list": [encode_spec(v) for v in spec]}
    if type(spec) is dict:
        for key in spec:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise CheckpointError(f"cannot save a data_spec dict key {key!r}: only str "
                                      "and int keys are supported")
        return {"dict": [[k, encode_spec(v)] for k, v in spec.items()]}
    raise CheckpointError(f"cannot save a data_spec containing {type(spec).__name__}")


def decode_spec(obj: Any) -> Any:
    """Inverse of :func:`encode_spec`.

    A namedtuple comes back as its original class when that class is already
    imported (nothing is imported to find it); otherwise as an equivalent
    namedtuple with the same name and fields.
    """
    if not isinstance(obj, dict) or len(obj) == 0:
        raise CheckpointError(f"malformed data_spec entry {obj!r}")
    if "spec" in obj:
        return spec_from_dict(obj["spec"])
    if "none" in obj:
        return None
    if "tuple" in obj:
        return tuple(decode_spec(v) for v in obj["tuple"])
    if "list" in obj:
        return [decode_spec(v) for v in obj["list"]]
    if "dict" in obj:
        return {k: decode_spec(v) for k, v in obj["dict"]}
    if "namedtuple" in obj:
        cls = _namedtuple_class(obj["module"], obj["namedtuple"], obj["fields"])
        return cls(*(decode_spec(v) for v in obj["values"]))
    raise CheckpointError(f"malformed data_spec entry {obj!r}")


def _namedtuple_class(module: str, qualname: str, fields: list[str]) -> type:
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, tuple) and \
            list(getattr(found, "_fields", ())) == fields:
        return found
    return collections.namedtuple(qualname.split(".")[-1], fields)


def matching_spec(saved: Any, wanted: Any, directory: Path) -> Any:
    """``wanted`` (a spec a caller expects) as a data spec, when its leaves and structure
    equal the ``saved`` one's (its own container classes are kept).

    Raises:
        CheckpointError: they differ; the message shows both.
    """
    wanted = as_data_spec(wanted)
    saved_leaves, saved_structure = nest.flatten(saved)
    wanted_leaves, wanted_structure = nest.flatten(wanted)
    if saved_leaves != wanted_leaves or \
            nest.describe(saved_structure) != nest.describe(wanted_structure):
        raise CheckpointError(f"data_spec does not match the save in {directory}: saved "
                              f"{saved!r}, given {wanted!r}")
    return wanted
