"""The TF-Agents replay-buffer tutorial, cell by cell, in replaybuffer's API.

Run it with ``replaybuffer demo`` (or ``python -m replaybuffer_demos.tutorial``).
It prints the same shapes as the tutorial's printed outputs: a sample is a
2-tuple ``(items, info)``; ``as_dataset(sample_batch_size=4, num_steps=2)`` gives
``[4, 2, ...]`` leaves; ``gather_all`` gives ``[32, 6, ...]`` after six adds.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import replaybuffer as rb
from replaybuffer import nest
from replaybuffer.compat.tf_agents import PyUniformReplayBuffer


def shapes(tree: Any) -> Any:
    """The nest of leaf shapes, as tuples."""
    return nest.map_structure(lambda t: tuple(t.shape), tree)


def main(storage: str = "numpy", echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Walk through the tutorial; return the printed values for tests."""
    echo(f"# UniformReplayBuffer (storage={storage!r}), the tutorial's TFUniformReplayBuffer")
    data_spec = (
        rb.ArraySpec([3], np.float32, "action"),
        (
            rb.ArraySpec([5], np.float32, "lidar"),
            rb.ArraySpec([3, 2], np.float32, "camera"),
        ),
    )
    batch_size = 32
    max_length = 1000
    replay_buffer = rb.UniformReplayBuffer(data_spec, batch_size=batch_size,
                                           max_length=max_length, storage=storage, seed=0)
    echo(f"{replay_buffer}  capacity={replay_buffer.capacity}  "
         f"preallocated {replay_buffer.nbytes / 2**20:.1f} MiB")

    # Writing to the buffer: one step for each of the 32 rows.
    action = 1 * np.ones(data_spec[0].shape, dtype=np.float32)
    lidar = 2 * np.ones(data_spec[1][0].shape, dtype=np.float32)
    camera = 3 * np.ones(data_spec[1][1].shape, dtype=np.float32)
    values = (action, (lidar, camera))
    values_batched = nest.map_structure(lambda t: np.stack([t] * batch_size), values)
    replay_buffer.add_batch(values_batched)

    # Reading from the buffer.
    for _ in range(5):
        replay_buffer.add_batch(values_batched)
    sample = replay_buffer.get_next(sample_batch_size=10, num_steps=1)
    echo(f"len(get_next(sample_batch_size=10, num_steps=1)) = {len(sample)} "
         "(a pair: items, info)")

    dataset = replay_buffer.as_dataset(sample_batch_size=4, num_steps=2)
    iterator = iter(dataset)
    echo("Iterator trajectories:")
    trajectories = []
    for _ in range(3):
        t, _ = next(iterator)
        trajectories.append(t)
    iterator_shapes = shapes(trajectories)
    echo(str(iterator_shapes))

    trajectories = replay_buffer.gather_all()
    echo("Trajectories from gather all:")
    gather_shapes = shapes(trajectories)
    echo(str(gather_shapes))

    echo("\n# PyUniformReplayBuffer, same capacity, from replaybuffer.compat.tf_agents")
    py_replay_buffer = PyUniformReplayBuffer(capacity=max_length * batch_size,
                                             data_spec=data_spec)
    py_replay_buffer.add_batch(nest.map_structure(lambda t: t[None], values))
    items, info = py_replay_buffer.get_next(sample_batch_size=2)
    echo(f"size={py_replay_buffer.size}  get_next(2) -> {shapes(items)}  "
         f"info.probabilities={info.probabilities.tolist()}")
    return {"len_sample": len(sample), "iterator_shapes": iterator_shapes,
            "gather_all_shapes": gather_shapes}


if __name__ == "__main__":
    main()
