"""Opening the files a client names (checkpoints, adapters, their configs): regular files only,
and only up to a size, checked on the open file itself before a byte is read. Opening a FIFO
for reading waits for a writer, for ever; a device or a huge sparse file reads without end.
The open never blocks (O_NONBLOCK), and what it found is judged from its descriptor, so that
nothing can swap the file between the check and the read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

CONFIG_BYTES = 16 << 20  # a JSON file of settings (config.json, adapter_config.json, an index)


class NotARegularFile(OSError):
    """The path names something other than a regular file (a FIFO, a device, a folder)."""


class FileTooLarge(OSError):
    """The file is larger than what may be read of it."""


def regular_fd(path: str | Path, max_bytes: int | None = None) -> int:
    """A blocking descriptor of the regular file at `path`, for reading; raises NotARegularFile,
    FileTooLarge, or the open's own OSError (FileNotFoundError and the like)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"{path}: not a regular file")
        if max_bytes is not None and info.st_size > max_bytes:
            raise FileTooLarge(f"{path}: {info.st_size} bytes, more than the {max_bytes} allowed")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, max_bytes: int = CONFIG_BYTES) -> bytes:
    """The whole of a regular file of at most `max_bytes` bytes."""
    with os.fdopen(regular_fd(path, max_bytes), "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew since the check
        raise FileTooLarge(f"{path}: more than the {max_bytes} bytes allowed")
    return data
