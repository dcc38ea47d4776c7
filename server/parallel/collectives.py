"""What the ranks of any process group agree on over its gloo (CPU) channel."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def min_over(cpu_group: Any, value: int) -> int:
    """The smallest of every rank's `value` in `cpu_group`."""
    tensor = torch.tensor([value], dtype=torch.int64)
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MIN
    cpu_group.allreduce([tensor], options).wait()
    return int(tensor.item())
