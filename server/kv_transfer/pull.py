"""pull_blocks: the decode side's end of a hand-off: one pull from a prefill replica's side channel,
the blocks' bytes back as a tensor. A refusal (the side channel's answer: unknown engine or
request, blocks not held, another layout) is the request's fault; no answer in time, or a
connection lost, is the prefill side's, and the decode side computes the prompt itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import zmq

from argosy.server.kv_transfer.wire import KVLayout, PullRequest, decode_reply, encode


@dataclass(frozen=True)
class NixlSource:
    agent: bytes  # the prefill agent's metadata
    descs: bytes  # the regions of the blocks pulled, in the pull's order


class PullRefused(Exception):
    """The prefill side refused the pull: the request's kv_transfer_params are forged or stale."""


class PullFailed(Exception):
    """No answer from the prefill side (gone, or too slow)."""


def pull_blocks(
    context: zmq.Context, address: str, pull: PullRequest, dtype: torch.dtype, timeout: float
) -> torch.Tensor | NixlSource:
    """[layers, 2, blocks, block_size, kv_heads, head_dim] of `dtype`, on the host; with NIXL, where
    to read them."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(address)
        socket.send(encode(pull))
        if not socket.poll(int(timeout * 1000)):
            raise PullFailed(f"no answer from {address} in {timeout:g}s")
        header, *rest = socket.recv_multipart(copy=False)
        reply = decode_reply(header.bytes)
        if reply.error is not None:
            raise PullRefused(reply.error)
        if reply.failure is not None:
            raise PullFailed(reply.failure)
        layers, kv, *block = pull.layout.block_shape
        shape = (layers, kv, reply.num_blocks, *block)
        if len(rest) != 1 or reply.num_blocks != len(pull.block_ids):
            raise PullFailed(f"{address} answered {reply.num_blocks} blocks for {len(pull.block_ids)}")
        if not reply.num_blocks:  # a hold let go, nothing pulled
            return torch.empty(shape, dtype=dtype)
        if pull.nixl:
            return NixlSource(reply.nixl_agent, reply.nixl_descs)
        # A copy: the frame's memory is ZMQ's, gone with the socket.
        data = torch.frombuffer(bytearray(rest[0].buffer), dtype=dtype)
        if data.numel() != torch.Size(shape).numel():
            raise PullFailed(f"{address} sent {data.numel()} values for blocks of shape {list(shape)}")
        return data.view(shape)
    finally:
        socket.close(linger=0)


def layout_of(block_shape: tuple[int, ...], dtype: torch.dtype, tp_size: int = 1) -> KVLayout:
    return KVLayout(tuple(block_shape), str(dtype).removeprefix("torch."), tp_size)
