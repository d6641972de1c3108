"""A collector thread adds while learner threads sample: no torn items, no crossed heads."""

import threading

import numpy as np

import replaybuffer as rb
from conftest import to_np

WIDTH = 64


def test_concurrent_add_and_sample_never_tears(storage):
    # Every leaf of the step written at add t in row b holds the same stamp t * 8 + b,
    # so a sampled step mixing two writes would show two different stamps.
    spec = {"a": rb.ArraySpec((WIDTH,), np.int64), "b": rb.ArraySpec((3, WIDTH), np.float64),
            "c": rb.ArraySpec((), np.int32)}
    buf = rb.UniformReplayBuffer(spec, 4, 16, seed=0, **storage)
    for t in range(3):  # enough for a window of 3 before any learner starts
        buf.add_batch(stamped(t))
    stop = threading.Event()
    errors: list[str] = []
    reads = [0, 0, 0]

    def collector():
        for t in range(3, 3000):
            buf.add_batch(stamped(t))
        stop.set()

    def learner(index, use_dataset):
        try:
            read(index, use_dataset)
        except Exception as exc:  # a dead learner must fail the test, not pass it
            errors.append(repr(exc))

    def read(index, use_dataset):
        it = iter(buf.as_dataset(32, num_steps=3, num_parallel_calls=2)) if use_dataset else None
        while not stop.is_set():
            reads[index] += 1
            items, info = next(it) if use_dataset else buf.get_next(32, num_steps=3)
            a, b, c = to_np(items["a"]), to_np(items["b"]), to_np(items["c"])
            stamp = a[..., 0]
            if not ((a == stamp[..., None]).all() and (b == stamp[..., None, None]).all()
                    and (c == stamp).all()):
                errors.append("torn step")
            if not (np.diff(stamp // 8, axis=1) == 1).all():
                errors.append("window not consecutive")
            if not (to_np(info.ids) == stamp // 8).all():
                errors.append("ids do not match the data")
        if use_dataset:
            it.close()

    threads = [threading.Thread(target=collector)] + \
        [threading.Thread(target=learner, args=(i, i % 2 == 1)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:5]
    assert min(reads) >= 10, reads  # every learner really overlapped with the writes
    assert buf.last_id == 2999


def stamped(t):
    stamp = t * 8 + np.arange(4)
    return {"a": np.repeat(stamp[:, None], WIDTH, 1),
            "b": np.broadcast_to(stamp[:, None, None], (4, 3, WIDTH)).astype(np.float64),
            "c": stamp.astype(np.int32)}
