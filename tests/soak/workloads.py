"""What a soak's child processes do until they are killed: write a shared buffer, sample
and reprioritize it, write an mmap buffer, save a buffer into a series of checkpoints.

Run as ``python workloads.py NAME JSON`` (the scenarios do): a child prints ``ready``
once it has done its first unit of work, then one line per unit (``committed ID``,
``saved LAST_ID``), flushed, so that the parent knows what was done before the kill.
Items say what they are: a step of ``row`` ``r`` and ``step`` ``t`` holds
``payload = t + r / 8`` in every element, so a torn item (bytes of two writes) shows.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any

import numpy as np

PAYLOAD = 64


def shared_spec() -> dict[str, Any]:
    from replaybuffer.specs import ArraySpec
    return {"row": ArraySpec((), np.int64), "step": ArraySpec((), np.int64),
            "payload": ArraySpec((PAYLOAD,), np.float32)}


def shared_items(rows: np.ndarray, steps: np.ndarray) -> dict[str, np.ndarray]:
    """Items ``[len(rows)]`` for ``rows`` at ``steps`` (int64 ``[n]`` each)."""
    payload = steps.astype(np.float32) + rows.astype(np.float32) / 8
    return {"row": rows.astype(np.int64), "step": steps.astype(np.int64),
            "payload": np.repeat(payload[:, None], PAYLOAD, 1)}


def local_spec() -> dict[str, Any]:
    from replaybuffer.specs import ArraySpec
    return {"t": ArraySpec((), np.int64), "row": ArraySpec((), np.int64),
            "payload": ArraySpec((PAYLOAD,), np.float32)}


def local_item(t: int, batch: int) -> dict[str, np.ndarray]:
    """One add of step ``t`` to each of ``batch`` rows of a local buffer."""
    rows = np.arange(batch)
    payload = np.float32(t) + rows.astype(np.float32) / 8
    return {"t": np.full(batch, t, np.int64), "row": rows,
            "payload": np.repeat(payload[:, None], PAYLOAD, 1).astype(np.float32)}


def say(*words: Any) -> None:
    print(*words, flush=True)


def shared_writer(args: dict[str, Any]) -> None:
    """Claim ``rows`` rows and add to them without end."""
    with open(args["handle"], "rb") as fh:
        buffer = pickle.load(fh)
    first, count = buffer.claim_rows(args["rows"])
    rows = np.arange(first, first + count)
    step = int(buffer.steps_written()[first])
    while True:
        buffer.add_batch(shared_items(rows, np.full(count, step)))
        if step == int(args.get("ready_after", 0)):
            say("ready")
        step += 1


def shared_sampler(args: dict[str, Any]) -> None:
    """Sample without end; on a prioritized buffer set new priorities in [0.5, 2)."""
    with open(args["handle"], "rb") as fh:
        buffer = pickle.load(fh)
    rng = np.random.default_rng(args["seed"])
    said = False
    while True:
        _, info = buffer.get_next(32)
        if args["prioritized"]:
            buffer.update_priorities(info.ids, 0.5 + 1.5 * rng.random(len(info.ids)))
        if not said:
            say("ready")
            said = True


def shared_block_writer(args: dict[str, Any]) -> None:
    """Claim ``rows`` rows of a prioritized buffer and ``extend`` them without end, in
    blocks of 2 to ``max_length`` steps (each one lock section: the block's positions
    odd from the rows' heads while its data is written)."""
    with open(args["handle"], "rb") as fh:
        buffer = pickle.load(fh)
    rng = np.random.default_rng(args["seed"])
    first, count = buffer.claim_rows(args["rows"])
    rows = np.arange(first, first + count)
    step = int(buffer.steps_written()[first])
    blocks = 0
    while True:
        length = int(rng.integers(2, buffer.max_length + 1))
        steps = step + np.arange(length)
        items = shared_items(np.repeat(rows, length), np.tile(steps, count))
        buffer.extend({k: v.reshape(count, length, *v.shape[1:]) for k, v in items.items()})
        step += length
        blocks += 1
        if blocks == int(args.get("ready_after", 1)):
            say("ready")


def shared_checking_sampler(args: dict[str, Any]) -> None:
    """Draw from a prioritized buffer without end, checking every sampled item against
    the row and step its id names (``torn N``, flushed, when ``N`` of a draw are not),
    and set new priorities in [0.5, 2); ``draws N`` every 64 draws."""
    with open(args["handle"], "rb") as fh:
        buffer = pickle.load(fh)
    rng = np.random.default_rng(args["seed"])
    rows_total = buffer.num_rows
    draws = 0
    while True:
        items, info = buffer.get_next(32)
        ids = np.asarray(info.ids)
        rows, steps = ids % rows_total, ids // rows_total
        want = steps.astype(np.float32) + rows.astype(np.float32) / 8
        torn = int(((items["payload"] != want[:, None]).any(1) | (items["row"] != rows)
                    | (items["step"] != steps)).sum())
        if torn:
            say("torn", torn)
        buffer.update_priorities(info.ids, 0.5 + 1.5 * rng.random(len(info.ids)))
        draws += 1
        if draws == 1:
            say("ready")
        if draws % 64 == 0:
            say("draws", draws)


def add_one_step(buffer: Any, rows: np.ndarray, step: int,
                 rng: np.random.Generator) -> int:
    """:func:`shared_everything`'s write: one step of :func:`shared_items` to ``rows``
    at ``step``; the last step written."""
    buffer.add_batch(shared_items(rows, np.full(len(rows), step)))
    return step


def shared_everything(args: dict[str, Any], write: Any = add_one_step) -> None:
    """Attach, claim rows, write (``write(buffer, rows, step, rng)``, the last step
    written), sample and reprioritize, then give the rows up (``close``), ``units``
    times: every path of a shared buffer, each passed once a unit, for crash points of
    any of them."""
    rng = np.random.default_rng(args["seed"])
    for _ in range(args["units"]):
        with open(args["handle"], "rb") as fh:
            buffer = pickle.load(fh)
        first, count = buffer.claim_rows(args["rows"])
        rows = np.arange(first, first + count)
        step = write(buffer, rows, int(buffer.steps_written()[first]), rng)
        _, info = buffer.get_next(16)
        if args["prioritized"]:
            buffer.update_priorities(info.ids, 0.5 + 1.5 * rng.random(len(info.ids)))
        buffer.close()
        say("committed", step)


def shared_clear_save(args: dict[str, Any]) -> None:
    """Attach, claim rows, then ``units`` times: add a step, save the buffer into the
    series ``root``, clear it; reporting each save and clear once done."""
    with open(args["handle"], "rb") as fh:
        buffer = pickle.load(fh)
    first, count = buffer.claim_rows(args["rows"])
    rows = np.arange(first, first + count)
    for _ in range(args["units"]):
        step = int(buffer.steps_written()[first])
        buffer.add_batch(shared_items(rows, np.full(count, step)))
        buffer.save(args["root"], keep=2)
        say("saved", step)
        buffer.clear()
        say("cleared", step)
    buffer.close()


def mmap_writer(args: dict[str, Any]) -> None:
    """Add to an mmap buffer (made, or reopened where it exists) and report each commit;
    every ``grow_every`` adds one ``extend`` of one step more than the last (so that the
    journal, sized for the largest commit yet, is recreated larger each time)."""
    import replaybuffer as rb
    from pathlib import Path
    path = Path(args["path"])
    if (path / "data").exists():
        buffer = rb.reopen(path)
    else:
        buffer = rb.UniformReplayBuffer(local_spec(), args["batch"], args["length"], seed=0,
                                        storage="mmap", path=path)
    t = buffer.last_id + 1
    say("ready")
    grow = 2
    for unit in range(args["units"]):
        if unit % args["grow_every"] == args["grow_every"] - 1:
            grow = min(grow + 1, args["length"])
            steps = [local_item(t + k, args["batch"]) for k in range(grow)]
            buffer.extend({k: np.stack([s[k] for s in steps], 1) for k in steps[0]})
            t += grow
        else:
            buffer.add_batch(local_item(t, args["batch"]))
            t += 1
        say("committed", buffer.last_id)


def saver(args: dict[str, Any]) -> None:
    """Add a step and save into the series ``root`` (``keep`` checkpoints), ``units``
    times, reporting the last id each save holds."""
    import replaybuffer as rb
    buffer = rb.UniformReplayBuffer(local_spec(), args["batch"], args["length"], seed=0)
    say("ready")
    for t in range(args["units"]):
        buffer.add_batch(local_item(t, args["batch"]))
        buffer.save(args["root"], keep=args["keep"])
        say("saved", buffer.last_id)


WORKLOADS = {"shared_writer": shared_writer, "shared_sampler": shared_sampler,
             "shared_block_writer": shared_block_writer,
             "shared_checking_sampler": shared_checking_sampler,
             "shared_everything": shared_everything, "mmap_writer": mmap_writer,
             "saver": saver, "shared_clear_save": shared_clear_save}


if __name__ == "__main__":
    WORKLOADS[sys.argv[1]](json.loads(sys.argv[2]))
    say("done")
