"""Weight streaming from the learner to 1 and 4 inference servers, full and delta sync.

A real LearnerService on 127.0.0.1 holds a 100 MB+ model (a frozen 90% "backbone" plus a
trainable head, like a VLA fine-tuned with `freeze_backbone`). Puller processes fetch each new
version with `pull_weights`, the inference server's code path, either in full or as a delta on
the version they hold. Reported: seconds per version and MB/s of model delivered (model size x
pullers / wall time), as ratios against full sync to one server measured in the same process.

    .venv/bin/python bench/weight_sync.py [--mb 104] [--frozen 0.9] [--versions 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import torch
from safetensors.torch import save as st_save

from rlfleet.inference_server.weight_subscriber import pull_weights
from rlfleet.learner.ingest import IngestQueue
from rlfleet.learner.service import LearnerServicer
from rlfleet.learner.weight_publisher import WeightPublisher, tensor_digests
from rlfleet.wire.gen import learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel, start_grpc_server


def make_model(total_mb: float, frozen_fraction: float) -> tuple[dict[str, torch.Tensor], frozenset[str]]:
    """Float32 tensors of ~4 MB each; the first `frozen_fraction` of them never change."""
    per = 1024 * 1024  # floats per tensor = 4 MB
    n = max(2, round(total_mb * 1024 * 1024 / 4 / per))
    tensors = {f"layer{i:03d}.weight": torch.randn(per) for i in range(n)}
    frozen = frozenset(list(tensors)[: int(n * frozen_fraction)])
    return tensors, frozen


def puller(address: str, delta: bool, go, done, results) -> None:
    channel = make_channel(address)
    stub = learner_pb2_grpc.LearnerServiceStub(channel)
    known = pull_weights(stub).version  # the initial full pull, like an inference server's start
    done.put(-1)  # ready
    while True:
        version = go.get()
        if version is None:
            break
        t0 = time.perf_counter()
        got = pull_weights(stub, version, known if delta else None)
        results.put((time.perf_counter() - t0, len(got.data)))
        known = got.version
        done.put(version)
    channel.close()


def run_case(address: str, publish, n_pullers: int, delta: bool, versions: int, model_bytes: int) -> dict:
    ctx = mp.get_context("spawn")
    gos, done, results = [ctx.Queue() for _ in range(n_pullers)], ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=puller, args=(address, delta, g, done, results)) for g in gos]
    for p in procs:
        p.start()
    for _ in range(n_pullers):  # every puller has made its initial full pull
        done.get(timeout=600)
    walls, sent = [], 0
    for _ in range(versions):
        version = publish()
        t0 = time.perf_counter()
        for g in gos:
            g.put(version)
        for _ in range(n_pullers):
            done.get(timeout=600)
        walls.append(time.perf_counter() - t0)
        sent += sum(results.get()[1] for _ in range(n_pullers))
    for g in gos:
        g.put(None)
    for p in procs:
        p.join()
    wall = sum(walls) / len(walls)
    return {
        "pullers": n_pullers,
        "delta": delta,
        "s_per_version": wall,
        "model_MBps": model_bytes * n_pullers / wall / 1e6,
        "wire_MB_per_version": sent / versions / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=104.0, help="model size in MB")
    ap.add_argument("--frozen", type=float, default=0.9, help="fraction of the model that is frozen")
    ap.add_argument("--versions", type=int, default=3, help="versions pulled per case")
    args = ap.parse_args()

    tensors, frozen = make_model(args.mb, args.frozen)
    publisher = WeightPublisher()
    servicer = LearnerServicer("runner: {}\n", "bench", IngestQueue(1), publisher)
    server, port = start_grpc_server(
        "127.0.0.1",
        0,
        [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s)],
        ["rlfleet.v1.LearnerService"],
    )
    state = {"version": 0, "digests": {}}

    def publish() -> int:
        """One 'update': every trainable tensor changes, the frozen ones do not."""
        for name, t in tensors.items():
            if name not in frozen:
                t.add_(1e-3)
        t0 = time.perf_counter()
        state["digests"] = tensor_digests(tensors, state["digests"], frozen)
        publisher.publish(state["version"], st_save(tensors), state["digests"])
        state["publish_s"] = time.perf_counter() - t0
        state["version"] += 1
        return state["version"] - 1

    publish()
    model_bytes = len(publisher.current().data)
    print(
        f"model: {model_bytes / 1e6:.1f} MB in {len(tensors)} tensors, {len(frozen)} frozen "
        f"({args.frozen:.0%}); learner publish (digests + serialise) {state['publish_s']:.2f} s"
    )
    address = f"127.0.0.1:{port}"
    rows = [
        run_case(address, publish, n, delta, args.versions, model_bytes)
        for n, delta in ((1, False), (4, False), (1, True), (4, True))
    ]
    base = rows[0]["model_MBps"]
    print(f"{'pullers':>7} {'sync':>5} {'s/version':>10} {'wire MB':>8} {'model MB/s':>11} {'vs full->1':>10}")
    for r in rows:
        print(
            f"{r['pullers']:>7} {'delta' if r['delta'] else 'full':>5} {r['s_per_version']:>10.2f} "
            f"{r['wire_MB_per_version']:>8.1f} {r['model_MBps']:>11.1f} {r['model_MBps'] / base:>9.2f}x"
        )
    server.stop(grace=0)


if __name__ == "__main__":
    main()
