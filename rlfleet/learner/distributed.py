"""The learner's ranks under torchrun: rank 0 runs the learner, the others train in lockstep.

torchrun sets WORLD_SIZE / RANK / LOCAL_RANK. With WORLD_SIZE > 1 the learner joins a process
group (NCCL with rank r on cuda:LOCAL_RANK where CUDA is available, gloo on CPU otherwise).
Rank 0 alone serves LearnerService, publishes weights and writes checkpoints and TensorBoard;
for each update it broadcasts the segments it gathered to the other ranks, as the segment wire
encoding (raw dtype/shape/bytes, never pickle) over a CPU gloo group whose long timeout lets the
other ranks wait while the fleet is slow. Every rank then prepares only its share of the env
columns (rlfleet.learner.sharding), and the trainer averages gradients with DDP.

`SingleRank` is the one-process case with identity collectives, so the trainer has one code path.
"""

from __future__ import annotations

import inspect
import io
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlfleet.wire.codec import decode_frames, encode_frames
from rlfleet.wire.run_spec import RunSpec
from rlfleet.wire.segment import Segment

log = logging.getLogger(__name__)

_STOP, _UPDATE = 0, 1


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int


def torchrun_ranks(environ: dict[str, str] | None = None) -> RankInfo | None:
    """This process's place in a torchrun job; None when it runs on its own (WORLD_SIZE unset or 1)."""
    env = os.environ if environ is None else environ
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    return RankInfo(int(env["RANK"]), int(env.get("LOCAL_RANK", "0")), world)


def backend_and_device(backend: str, local_rank: int, cuda_devices: int | None = None) -> tuple[str, str]:
    """auto: NCCL on cuda:LOCAL_RANK when CUDA is available, else gloo on the CPU."""
    n = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if backend == "auto":
        backend = "nccl" if n > 0 else "gloo"
    if backend == "gloo":
        return "gloo", "cpu"
    if backend != "nccl":
        raise ValueError(f"learner.distributed.backend must be auto, nccl or gloo, got {backend!r}")
    if n == 0:
        raise ValueError("learner.distributed.backend=nccl needs CUDA, and no CUDA device is visible")
    if local_rank < n:
        return "nccl", f"cuda:{local_rank}"
    if n == 1:  # each rank pinned to its own GPU with CUDA_VISIBLE_DEVICES
        return "nccl", "cuda:0"
    raise ValueError(
        f"LOCAL_RANK {local_rank} has no GPU of its own: {n} visible; "
        "start at most that many ranks per node (--nproc-per-node)"
    )


# --- segments as one byte buffer ----------------------------------------------------------------


def pack_segments(segments: list[Segment]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, payload): each segment's ZeroMQ frames (header + raw tensors) laid end to end.

    lengths = [num_segments, frames of segment 0, ..., frames of segment M-1, frame sizes...].
    """
    frames = [encode_frames(seg.to_tensors()) for seg in segments]
    sizes = [memoryview(f).nbytes for fs in frames for f in fs]
    lengths = np.array([len(frames), *(len(fs) for fs in frames), *sizes], np.int64)
    payload = np.empty(sum(sizes), np.uint8)
    pos = 0
    for f in (f for fs in frames for f in fs):
        n = memoryview(f).nbytes
        payload[pos : pos + n] = np.frombuffer(f, np.uint8)
        pos += n
    return lengths, payload


def unpack_segments(lengths: np.ndarray, payload: np.ndarray) -> list[Segment]:
    """Inverse of pack_segments; the arrays are read-only views of `payload` (validated, no copy)."""
    count = int(lengths[0])
    per_segment = [int(n) for n in lengths[1 : 1 + count]]
    sizes = iter(int(n) for n in lengths[1 + count :])
    view, pos, out = payload.data.cast("B"), 0, []
    for n_frames in per_segment:
        frames = []
        for _ in range(n_frames):
            size = next(sizes)
            frames.append(view[pos : pos + size])
            pos += size
        out.append(Segment.from_tensors(decode_frames(frames)))
    return out


# --- the ranks ----------------------------------------------------------------------------------


class SingleRank:
    """One learner process: every collective is the identity."""

    rank = 0
    world_size = 1
    is_main = True

    def device(self, requested: str) -> str:
        return requested

    def wrap(self, module: nn.Module, some_unused: bool = False) -> nn.Module:
        return module

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_buffers(self, module: nn.Module) -> None:
        return None

    def sync_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        return None

    def send_config(self, yaml_text: str, spec: RunSpec) -> None:
        return None

    def send_update(self, segments: list[Segment], version: int) -> None:
        return None

    def send_stop(self) -> None:
        return None

    def close(self) -> None:
        return None


class DDPRanks:
    """A rank of a torchrun job: the training process group plus a CPU gloo group for data."""

    def __init__(
        self,
        info: RankInfo,
        backend: str,
        device: str,
        timeout_s: float = 1800.0,
        idle_timeout_s: float = 7 * 24 * 3600.0,
        find_unused_parameters: bool | None = None,
    ):
        self.rank, self.world_size, self.local_rank = info.rank, info.world_size, info.local_rank
        self.is_main = info.rank == 0
        self._device, self.backend, self.find_unused_parameters = device, backend, find_unused_parameters
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend, rank=info.rank, world_size=info.world_size, timeout=timedelta(seconds=timeout_s)
        )
        # Segments travel on the CPU (each rank moves only its own columns to its device), and
        # ranks > 0 block here while rank 0 waits for the fleet: hence gloo with a long timeout.
        self.data_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=idle_timeout_s))
        log.info(
            "learner rank %d of %d on host %s (local rank %d, %s, %s)",
            self.rank,
            self.world_size,
            socket.gethostname(),
            self.local_rank,
            device,
            backend,
        )

    def device(self, requested: str) -> str:
        if requested not in ("cpu", self._device):
            log.info(
                "learner.device=%s ignored under torchrun: rank %d trains on %s", requested, self.rank, self._device
            )
        return self._device

    def wrap(self, module: nn.Module, some_unused: bool = False) -> nn.Module:
        """DDP, with every rank holding rank 0's weights and buffers (a resumed run's) from here on.

        The constructor broadcasts the parameters; buffers are sent here once and then after each
        normalisation update (`broadcast_buffers`), rather than by DDP before every forward.
        `some_unused`: some steps leave parameters out of the loss, so DDP must search the graph
        for them (unless learner.distributed.find_unused_parameters says otherwise).
        """
        find_unused = some_unused if self.find_unused_parameters is None else self.find_unused_parameters
        ids = [torch.device(self._device).index] if self._device.startswith("cuda") else None
        # newer torch (2.13) calls broadcast_buffers forward_sync_buffers; neither stops the sync at init
        no_forward_sync: dict[str, Any] = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else {"broadcast_buffers": False}
        )
        ddp = DistributedDataParallel(module, device_ids=ids, find_unused_parameters=find_unused, **no_forward_sync)
        self.broadcast_buffers(module)
        return ddp

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, src=0)
        return tensor

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_buffers(self, module: nn.Module) -> None:
        """Rank 0's running statistics (observation normalisation) to every rank."""
        for buf in module.buffers():
            dist.broadcast(buf, src=0)

    def sync_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Rank 0's optimiser state (restored from a checkpoint on resume) to every rank.

        torch.save bytes, loaded with weights_only=True (tensors and plain containers only).
        """
        data = None
        if self.is_main:
            buf = io.BytesIO()
            torch.save(optimizer.state_dict(), buf)
            data = np.frombuffer(buf.getbuffer(), np.uint8).copy()
        got = self._broadcast_array(data, np.uint8)
        if not self.is_main:
            optimizer.load_state_dict(torch.load(io.BytesIO(got.tobytes()), map_location="cpu", weights_only=True))

    def _broadcast_array(self, arr: np.ndarray | None, dtype: Any) -> np.ndarray:
        """A 1-D array from rank 0 (its length first) over the data group."""
        size = torch.tensor([len(arr) if arr is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.data_group)
        out = torch.from_numpy(arr) if arr is not None else torch.empty(int(size), dtype=_torch_dtype(dtype))
        if int(size):
            dist.broadcast(out, src=0, group=self.data_group)
        return out.numpy()

    def _send_header(self, command: int, version: int) -> None:
        dist.broadcast(torch.tensor([command, version], dtype=torch.int64), src=0, group=self.data_group)

    def send_config(self, yaml_text: str, spec: RunSpec) -> None:
        """The user's run config and the run spec (the dims, the policy settings rank 0 built its
        policy with) that ranks > 0 build their policy from."""
        for text in (yaml_text, spec.to_json()):
            self._broadcast_array(np.frombuffer(text.encode(), np.uint8).copy(), np.uint8)

    def receive_config(self) -> tuple[str, RunSpec]:
        yaml_text = self._broadcast_array(None, np.uint8).tobytes().decode()
        spec = RunSpec.from_json(self._broadcast_array(None, np.uint8).tobytes().decode(), "run spec from rank 0")
        return yaml_text, spec

    def send_update(self, segments: list[Segment], version: int) -> None:
        self._send_header(_UPDATE, version)
        lengths, payload = pack_segments(segments)
        self._broadcast_array(lengths, np.int64)
        self._broadcast_array(payload, np.uint8)

    def send_stop(self) -> None:
        self._send_header(_STOP, 0)

    def receive_update(self) -> tuple[list[Segment], int] | None:
        """The next update's segments and learner version; None when rank 0 has finished."""
        header = torch.zeros(2, dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.data_group)
        command, version = (int(x) for x in header)
        if command == _STOP:
            return None
        lengths = self._broadcast_array(None, np.int64)
        payload = self._broadcast_array(None, np.uint8)
        return unpack_segments(lengths, payload), version

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


Ranks = SingleRank | DDPRanks


def _torch_dtype(dtype: Any) -> torch.dtype:
    return {np.dtype(np.uint8): torch.uint8, np.dtype(np.int64): torch.int64}[np.dtype(dtype)]


def join_ranks(cfg: Any) -> Ranks:
    """DDPRanks under a multi-process torchrun job, else SingleRank (`cfg`: learner.distributed)."""
    info = torchrun_ranks()
    if info is None:
        return SingleRank()
    backend, device = backend_and_device(cfg.backend, info.local_rank)
    return DDPRanks(info, backend, device, cfg.timeout_s, cfg.idle_timeout_s, cfg.find_unused_parameters)


def global_mean_var(ranks: Ranks, *xs: torch.Tensor) -> list[tuple[float, float]]:
    """(mean, population variance) of each tensor's elements over all ranks, in float64.

    Two passes (sums, then squared deviations from the global mean): two all-reduces however
    many tensors; a tensor with no elements anywhere gives NaNs.
    """
    flat = [x.detach().reshape(-1).double() for x in xs]
    device = flat[0].device
    counts = [torch.tensor(float(x.numel()), dtype=torch.float64, device=device) for x in flat]
    sums = torch.stack([t for x, n in zip(flat, counts) for t in (x.sum(), n)])
    ranks.all_reduce_(sums)
    means = sums[0::2] / sums[1::2]
    sq = torch.stack([((x - m) ** 2).sum() for x, m in zip(flat, means)])
    ranks.all_reduce_(sq)
    var = sq / sums[1::2]
    return [(float(m), float(v)) for m, v in zip(means.tolist(), var.tolist())]
