"""DeepMind Reverb as a multi-process peer: N writer processes and one sampler process
against one reverb.Server, for a fixed time per configuration.

    bash benchmarks/setup_reverb.sh
    .venv-reverb/bin/python benchmarks/reverb_processes.py [--writers 1,2,4] \
        [--seconds 5] [--workload control,frames] [--sampler dataset|client] \
        [--flush-every 16]

Standalone: it does not import replaybuffer (its venv holds TensorFlow 2.15 and
numpy<2, not the project).

Per (workload, writers):
  * the server runs in this process on a free localhost port, with one table: uniform
    sampler, FIFO remover, max_size 100_000 (control) or 20_000 (frames), rate limiter
    MinSize(1000) (no samples-per-insert ratio, so neither side is throttled once 1000
    items are in), and a table signature (the item spec);
  * the table is prefilled with 1000 items from this process (not counted), so the
    sampler is never held by MinSize inside the timed window;
  * N writer processes ('spawn') each open a reverb.Client and a TrajectoryWriter
    (num_keep_alive_refs=1, so one step per chunk) and, as fast as they can: append one
    step, create_item of that step (history[k][-1]) with priority 1.0, and every
    FLUSH_EVERY items flush(block_until_num_items=FLUSH_EVERY), i.e. keep at most about
    2 * FLUSH_EVERY items unconfirmed, as Reverb users bound in-flight items; at the
    deadline a full flush() is timed too. FLUSH_EVERY = 16 keeps the writer under the
    pending-item count at which Reverb logs "The number of pending items is alarmingly
    high, did you forget to call Flush?" (32 triggers it thousands of times). Measured
    with one control writer and the sampler running: flush after every item ~2.5k
    items/s; every 8, 16, 24, 32 or 128 items ~4.2-4.8k/s, within noise (the writer is
    bound by its Python-side append/create_item). Step payloads cycle through 64
    pregenerated random steps (random bytes: Reverb's zstd chunk compression gains
    nothing, as on real float observations; real Atari frames would compress);
  * one sampler process draws batches of 256 items, by default through
    reverb.TrajectoryDataset.from_table_signature(max_in_flight_samples_per_worker=512)
    .batch(256, drop_remainder=True).prefetch(2) read with as_numpy_iterator() (the
    usual make_reverb_dataset pattern of Acme-style code, without its parallel
    interleave on this 2-core machine; batches land as numpy arrays); --sampler client
    uses client.sample(num_samples=..., emit_timesteps=False) and np.stack of 256
    items per leaf instead (about 8x slower: one Python object per item);
  * every child imports TensorFlow/Reverb, connects and warms up first, then all start
    together on one event; each counts its own items inside the window and reports
    items / its own elapsed seconds. inserts_per_s is the sum over writers;
    server_inserts is the table's completed-insert count over the same run (a check).
    Every process is joined with a timeout and killed if it does not end, and the
    server is stopped, before the next configuration.

One JSON object per line on stdout; Reverb's C++ logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

TABLE = "replay"
BATCH = 256
MIN_SIZE = 1000
FLUSH_EVERY = int(os.environ.get("RVB_FLUSH_EVERY", "16"))
MAX_IN_FLIGHT_SAMPLES = 2 * BATCH
POOL = 64
READY_TIMEOUT_S = 180.0
EXIT_GRACE_S = 30.0

# name -> (shape, numpy dtype)
WORKLOADS: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {
    "control": {"observation": ((17,), "float32"), "action": ((6,), "float32"),
                "reward": ((), "float32"), "discount": ((), "float32"),
                "step_type": ((), "int32")},
    "frames": {"observation": ((84, 84, 4), "uint8"), "action": ((), "int32"),
               "reward": ((), "float32"), "discount": ((), "float32"),
               "step_type": ((), "int32")},
}
MAX_SIZE = {"control": 100_000, "frames": 20_000}


def step_pool(workload: str, seed: int) -> list[dict[str, np.ndarray]]:
    """POOL random steps of the workload's spec."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(POOL):
        step = {}
        for name, (shape, dtype) in WORKLOADS[workload].items():
            if np.dtype(dtype).kind == "f":
                step[name] = rng.standard_normal(shape).astype(dtype)
            else:
                step[name] = rng.integers(0, 255, shape).astype(dtype)
        out.append(step)
    return out


def write_items(writer: Any, pool: list[dict[str, np.ndarray]], count: int,
                start: int = 0) -> None:
    for i in range(start, start + count):
        writer.append(pool[i % POOL])
        writer.create_item(TABLE, 1.0, {k: writer.history[k][-1] for k in pool[0]})
        if (i + 1) % FLUSH_EVERY == 0:
            writer.flush(block_until_num_items=FLUSH_EVERY)


# --- child processes -------------------------------------------------------------------

def _writer(address: str, workload: str, seed: int, go: Any, ready: Any, out: Any) -> None:
    try:
        import reverb
        client = reverb.Client(address)
        pool = step_pool(workload, seed)
        with client.trajectory_writer(num_keep_alive_refs=1) as writer:
            write_items(writer, pool, FLUSH_EVERY)  # warm-up (not counted)
            writer.flush()
            ready.put(("writer", os.getpid()))
            go.wait()
            t0 = time.monotonic()
            deadline = t0 + float(os.environ["RVB_SECONDS"])
            n = 0
            while time.monotonic() < deadline:
                write_items(writer, pool, FLUSH_EVERY, n)
                n += FLUSH_EVERY
            writer.flush()
            elapsed = time.monotonic() - t0
        out.put(("writer", os.getpid(), n, elapsed))
    except BaseException as e:  # report, never hang the parent
        out.put(("error", os.getpid(), f"writer: {type(e).__name__}: {e}"))
        raise


def _sampler(address: str, mode: str, go: Any, ready: Any, out: Any) -> None:
    try:
        import reverb
        seconds = float(os.environ["RVB_SECONDS"])
        if mode == "dataset":
            ds = reverb.TrajectoryDataset.from_table_signature(
                server_address=address, table=TABLE,
                max_in_flight_samples_per_worker=MAX_IN_FLIGHT_SAMPLES)
            ds = ds.batch(BATCH, drop_remainder=True).prefetch(2)
            it = ds.as_numpy_iterator()

            def next_batch() -> int:
                sample = next(it)
                return len(sample.info.key)
        else:
            client = reverb.Client(address)
            stream = client.sample(TABLE, num_samples=1 << 62, emit_timesteps=False)

            def next_batch() -> int:
                items = [next(stream).data for _ in range(BATCH)]
                leaves = [np.stack(col) for col in zip(*items)]
                return len(leaves[0])

        next_batch()  # warm-up (not counted)
        ready.put(("sampler", os.getpid()))
        go.wait()
        t0 = time.monotonic()
        deadline = t0 + seconds
        n = 0
        while time.monotonic() < deadline:
            n += next_batch()
        elapsed = time.monotonic() - t0
        out.put(("sampler", os.getpid(), n, elapsed))
    except BaseException as e:
        out.put(("error", os.getpid(), f"sampler: {type(e).__name__}: {e}"))
        raise


# --- one configuration -----------------------------------------------------------------

def make_table(reverb: Any, tf: Any, workload: str) -> Any:
    signature = {name: tf.TensorSpec(shape, dtype)
                 for name, (shape, dtype) in WORKLOADS[workload].items()}
    return reverb.Table(name=TABLE, sampler=reverb.selectors.Uniform(),
                        remover=reverb.selectors.Fifo(), max_size=MAX_SIZE[workload],
                        rate_limiter=reverb.rate_limiters.MinSize(MIN_SIZE),
                        signature=signature)


def inserts_completed(client: Any) -> int:
    info = client.server_info()[TABLE]
    return int(info.rate_limiter_info.insert_stats.completed)


def run_config(workload: str, writers: int, seconds: float, sampler: str) -> dict:
    import reverb
    import tensorflow as tf

    ctx = mp.get_context("spawn")
    os.environ["RVB_SECONDS"] = str(seconds)  # inherited by the spawned children
    server = reverb.Server(tables=[make_table(reverb, tf, workload)])
    procs: list[Any] = []
    try:
        address = f"localhost:{server.port}"
        client = reverb.Client(address)
        with client.trajectory_writer(num_keep_alive_refs=1) as w:
            write_items(w, step_pool(workload, 12345), MIN_SIZE)
            w.flush()
        go, ready, out = ctx.Event(), ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=_writer, args=(address, workload, 1000 + i, go, ready, out),
                             daemon=True) for i in range(writers)]
        procs.append(ctx.Process(target=_sampler, args=(address, sampler, go, ready, out),
                                 daemon=True))
        for p in procs:
            p.start()
        t_ready = time.monotonic() + READY_TIMEOUT_S
        for _ in procs:
            try:
                ready.get(timeout=max(0.1, t_ready - time.monotonic()))
            except queue.Empty:
                errors = drain(out)
                raise RuntimeError(
                    f"children not ready in {READY_TIMEOUT_S:.0f} s: {errors}") from None
        before = inserts_completed(client)
        go.set()
        results = []
        t_end = time.monotonic() + seconds + EXIT_GRACE_S
        while len(results) < len(procs):
            try:
                msg = out.get(timeout=max(0.1, t_end - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(
                    f"only {len(results)} of {len(procs)} children reported") from None
            if msg[0] == "error":
                raise RuntimeError(msg[2])
            results.append(msg)
        after = inserts_completed(client)
        ins = [r for r in results if r[0] == "writer"]
        smp = [r for r in results if r[0] == "sampler"]
        return {"peer": "reverb", "workload": workload, "writers": writers,
                "inserts_per_s": round(sum(n / e for _, _, n, e in ins), 1),
                "samples_per_s": round(sum(n / e for _, _, n, e in smp), 1),
                "seconds": seconds,
                "server_inserts": after - before,
                "sampler": sampler, "batch": BATCH, "flush_every": FLUSH_EVERY,
                "table_size": int(client.server_info()[TABLE].current_size)}
    finally:
        for p in procs:
            p.join(timeout=5.0 if p.exitcode is None else 0)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        server.stop()


def drain(q: Any) -> list:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


def main(argv: list[str] | None = None) -> int:
    global FLUSH_EVERY
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", default="1,2,4")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--workload", default="control,frames")
    ap.add_argument("--sampler", choices=("dataset", "client"), default="dataset")
    ap.add_argument("--flush-every", type=int, default=FLUSH_EVERY)
    args = ap.parse_args(argv)
    FLUSH_EVERY = args.flush_every
    os.environ["RVB_FLUSH_EVERY"] = str(args.flush_every)  # read by spawned children
    workloads = [w for w in args.workload.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    counts = [int(x) for x in args.writers.split(",") if x]
    failed = 0
    for workload in workloads:
        for n in counts:
            t0 = time.monotonic()
            try:
                row = run_config(workload, n, args.seconds, args.sampler)
            except Exception as e:  # one failed configuration does not stop the others
                failed += 1
                row = {"peer": "reverb", "workload": workload, "writers": n,
                       "error": f"{type(e).__name__}: {e}"}
            row["wall_s"] = round(time.monotonic() - t0, 1)
            print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
