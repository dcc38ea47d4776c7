"""read_tensors: a checkpoint's tensors into the tensors that hold them, at the disk's speed.

Memory-mapping a shard and copying from the map makes every page a fault, served one
read-ahead window at a time by one thread; here the bytes are read with large positional
reads from several threads at once, each range asked of the disk whole before it is read, so
the disk always has requests queued. A tensor stored in
the destination's dtype and layout (on the CPU) is read straight into the destination's memory;
any other (a dtype to convert, a slice of columns, a GPU) goes through a staging buffer per
thread, from which it is converted and copied. On CUDA the staging buffers are pinned and the
copies run on a stream per thread, so that reading the next chunk overlaps the copy of the
last. Row slices (tensor parallelism's) read only their rows; a slice of columns reads whole
rows, as the pages of a memory map would have been read."""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from argosy.server.exceptions import CheckpointError
from argosy.server.models.checkpoint import StoredTensor
from argosy.server.regular_files import regular_fd

CHUNK_BYTES = 32 << 20  # one read; large enough to stream, small enough to spread over threads
THREADS = 8  # reads in flight: NVMe drives want a deep queue


@dataclass(frozen=True)
class ReadStats:
    """What a load read: bytes from the files, and the wall time the reads (and copies) took."""

    bytes: int = 0
    seconds: float = 0.0

    def __add__(self, other: ReadStats) -> ReadStats:
        return ReadStats(self.bytes + other.bytes, self.seconds + other.seconds)


@dataclass(frozen=True)
class TensorRead:
    """One stored tensor, or a slice of it ((dimension 0 or 1, start, length)), into `dest`."""

    stored: StoredTensor
    dest: torch.Tensor
    part: tuple[int, int, int] | None = None


def read_tensors(reads: list[TensorRead], threads: int = THREADS) -> ReadStats:
    """Fills every read's destination."""
    start = time.perf_counter()
    device = next((r.dest.device for r in reads), torch.device("cpu"))
    staging = _CudaStaging(device) if device.type == "cuda" else _HostStaging()
    files = _OpenFiles()
    try:
        jobs = [job for read in reads for job in _jobs(read, files, staging)]
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="checkpoint-read") as pool:
            done = sum(pool.map(lambda job: job(), jobs))
        staging.finish()
        return ReadStats(done, time.perf_counter() - start)
    finally:
        files.close()


def _jobs(read: TensorRead, files: _OpenFiles, staging: _HostStaging):
    """The read as chunks of whole rows (a 1-D tensor's rows are its elements), each a job."""
    stored, dest = read.stored, read.dest
    shape = stored.shape or (1,)
    row_bytes = math.prod(shape[1:]) * stored.torch_dtype.itemsize
    first, rows = 0, shape[0]
    columns = None
    if read.part is not None:
        dim, start, length = read.part
        if dim == 0:
            first, rows = start, length
        else:
            columns = slice(start, start + length)
    direct = dest.device.type == "cpu" and columns is None and dest.dtype == stored.torch_dtype and dest.is_contiguous()
    per_chunk = max(1, CHUNK_BYTES // max(1, row_bytes))
    fd = files.open(stored.file)
    jobs = []
    for row in range(0, rows, per_chunk):
        count = min(per_chunk, rows - row)
        offset = stored.offset + (first + row) * row_bytes
        # view, never reshape: a copy would take the bytes instead of the destination
        target = dest.view(rows, -1)[row : row + count] if dest.dim() else dest.view(1, 1)
        if direct:
            jobs.append(_Direct(fd, offset, target, stored.file))
        else:
            jobs.append(_Staged(fd, offset, count, shape[1:], stored, columns, target, staging))
    return jobs


@dataclass
class _Direct:
    fd: int
    offset: int
    target: torch.Tensor  # contiguous rows of the destination, in the stored dtype
    file: Path

    def __call__(self) -> int:
        view = memoryview(self.target.view(torch.uint8).numpy()).cast("B")
        _read_fully(self.fd, view, self.offset, self.file)
        return len(view)


@dataclass
class _Staged:
    fd: int
    offset: int
    rows: int
    row_shape: tuple[int, ...]
    stored: StoredTensor
    columns: slice | None
    target: torch.Tensor  # the destination rows, flattened to 2-D
    staging: _HostStaging

    def __call__(self) -> int:
        dtype = self.stored.torch_dtype
        nbytes = self.rows * math.prod(self.row_shape) * dtype.itemsize
        buffer = self.staging.buffer(nbytes)
        _read_fully(self.fd, memoryview(buffer.numpy()).cast("B"), self.offset, self.stored.file)
        rows = buffer.view(dtype).view(self.rows, *self.row_shape)
        if self.columns is not None:
            rows = rows[:, self.columns]
        self.staging.copy(self.target, rows.reshape(self.rows, -1))
        return nbytes


def _read_fully(fd: int, view: memoryview, offset: int, file: Path) -> None:
    # The whole range asked of the disk at once: the reads that follow find it arriving,
    # instead of the read-ahead window growing one sequential read at a time.
    os.posix_fadvise(fd, offset, len(view), os.POSIX_FADV_WILLNEED)
    done = 0
    while done < len(view):
        count = os.preadv(fd, [view[done:]], offset + done)
        if count == 0:
            raise CheckpointError(file, f"corrupt or unreadable safetensors file (it ends at byte {offset + done})")
        done += count


class _OpenFiles:
    """One descriptor per shard, read from by every thread (positional reads share it safely)."""

    def __init__(self) -> None:
        self.fds: dict[Path, int] = {}

    def open(self, path: Path) -> int:
        if path not in self.fds:
            try:
                fd = regular_fd(path)
            except OSError as exc:
                raise CheckpointError(path, f"corrupt or unreadable safetensors file ({exc})") from exc
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            self.fds[path] = fd
        return self.fds[path]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


class _HostStaging:
    """A staging buffer per thread, in host memory; the copy out of it is done when it returns."""

    def __init__(self) -> None:
        self.local = threading.local()

    def buffer(self, nbytes: int) -> torch.Tensor:
        held = getattr(self.local, "buffer", None)
        if held is None or held.numel() < nbytes:
            held = self.local.buffer = self._allocate(nbytes)
        return held[:nbytes]

    def _allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy(self, target: torch.Tensor, rows: torch.Tensor) -> None:
        target.copy_(rows)

    def finish(self) -> None:
        """Once every job has run: every copy has landed."""


class _CudaStaging(_HostStaging):
    """Pinned buffers, two per thread, each copied to the device on the thread's own stream:
    the thread reads into one while the other's copy runs."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.streams: list[torch.cuda.Stream] = []
        self.lock = threading.Lock()
        self.before = torch.cuda.current_stream(device)  # what made the destinations (zeroed rows)

    def _state(self):
        local = self.local
        if not hasattr(local, "stream"):
            local.stream = torch.cuda.Stream(self.device)
            local.stream.wait_stream(self.before)
            local.buffers, local.events, local.turn = [None, None], [None, None], 0
            with self.lock:
                self.streams.append(local.stream)
        return local

    def buffer(self, nbytes: int) -> torch.Tensor:
        local = self._state()
        turn = local.turn = 1 - local.turn
        if local.events[turn] is not None:
            local.events[turn].synchronize()  # its last copy has left it
        held = local.buffers[turn]
        if held is None or held.numel() < nbytes:
            held = local.buffers[turn] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return held[:nbytes]

    def copy(self, target: torch.Tensor, rows: torch.Tensor) -> None:
        local = self._state()
        with torch.cuda.stream(local.stream):
            target.copy_(rows, non_blocking=True)
            local.events[local.turn] = torch.cuda.Event()
            local.events[local.turn].record(local.stream)

    def finish(self) -> None:
        current = torch.cuda.current_stream(self.device)
        for stream in self.streams:
            current.wait_stream(stream)
        torch.cuda.synchronize(self.device)
