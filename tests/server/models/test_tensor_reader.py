"""read_tensors against safetensors' own reading of the same files: straight into the
destination (same dtype), through the staging buffers (a dtype to convert, a slice of
columns), row slices, scalars and vectors, tensors spread over many chunks and threads; a file
shorter than its header says is refused naming the file; on CUDA, the pinned, overlapped path
gives the same tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from argosy.server.exceptions import CheckpointError
from argosy.server.models import tensor_reader
from argosy.server.models.checkpoint import stored_tensors
from argosy.server.models.tensor_reader import TensorRead, read_tensors


@pytest.fixture
def shard(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "matrix": torch.randn(96, 40, generator=generator).to(torch.bfloat16),
        "wide": torch.randn(7, 300, generator=generator),
        "vector": torch.randn(33, generator=generator).to(torch.float16),
        "scalar": torch.tensor(3.5),
        "cube": torch.randn(4, 6, 10, generator=generator),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    return tmp_path, path


def reference(path, name):
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(name)


@pytest.mark.parametrize("chunk", [1 << 20, 100], ids=["one-chunk", "many-chunks"])
def test_whole_tensors_in_their_dtype_and_converted(shard, monkeypatch, chunk):
    folder, path = shard
    monkeypatch.setattr(tensor_reader, "CHUNK_BYTES", chunk)
    stored = {t.name: t for t in stored_tensors(folder)}
    same = {name: torch.empty(t.shape, dtype=t.torch_dtype) for name, t in stored.items()}
    converted = {name: torch.empty(t.shape, dtype=torch.float64) for name, t in stored.items()}
    reads = [TensorRead(stored[n], d) for n, d in same.items()] + [
        TensorRead(stored[n], d) for n, d in converted.items()
    ]
    stats = read_tensors(reads, threads=4)
    assert stats.bytes == 2 * sum(t.nbytes for t in stored.values())
    for name in stored:
        expected = reference(path, name)
        assert torch.equal(same[name], expected), name
        assert torch.equal(converted[name], expected.to(torch.float64)), name


@pytest.mark.parametrize("chunk", [1 << 20, 100], ids=["one-chunk", "many-chunks"])
def test_row_and_column_slices(shard, monkeypatch, chunk):
    folder, path = shard
    monkeypatch.setattr(tensor_reader, "CHUNK_BYTES", chunk)
    stored = {t.name: t for t in stored_tensors(folder)}
    rows = torch.empty(24, 40, dtype=torch.bfloat16)
    columns = torch.empty(96, 10, dtype=torch.bfloat16)
    converted_columns = torch.empty(7, 100, dtype=torch.bfloat16)
    stats = read_tensors(
        [
            TensorRead(stored["matrix"], rows, (0, 48, 24)),
            TensorRead(stored["matrix"], columns, (1, 30, 10)),
            TensorRead(stored["wide"], converted_columns, (1, 100, 100)),
        ]
    )
    matrix, wide = reference(path, "matrix"), reference(path, "wide")
    assert torch.equal(rows, matrix[48:72])
    assert torch.equal(columns, matrix[:, 30:40])
    assert torch.equal(converted_columns, wide[:, 100:200].to(torch.bfloat16))
    assert stats.bytes == 24 * 40 * 2 + matrix.nbytes + wide.nbytes  # a row slice reads its rows only


def test_a_file_shorter_than_its_header_says_is_refused_naming_it(shard):
    folder, path = shard
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="does not lie within the file") as caught:
        stored_tensors(folder)
    assert str(path) in str(caught.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned, overlapped copies need CUDA")
def test_the_cuda_path_gives_the_same_tensors(shard, monkeypatch):
    folder, path = shard
    monkeypatch.setattr(tensor_reader, "CHUNK_BYTES", 100)
    stored = {t.name: t for t in stored_tensors(folder)}
    device = torch.device("cuda")
    whole = {name: torch.zeros(t.shape, dtype=torch.float32, device=device) for name, t in stored.items()}
    columns = torch.zeros(96, 10, dtype=torch.bfloat16, device=device)
    reads = [TensorRead(stored[n], d) for n, d in whole.items()] + [TensorRead(stored["matrix"], columns, (1, 30, 10))]
    read_tensors(reads)
    for name, tensor in whole.items():
        assert torch.equal(tensor.cpu(), reference(path, name).to(torch.float32)), name
    assert torch.equal(columns.cpu(), reference(path, "matrix")[:, 30:40])
