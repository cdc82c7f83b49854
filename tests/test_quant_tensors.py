"""helpers.quant.tensors: tensors read one at a time across shards, holes kept as holes, bytes kept as they were."""

import json
import os
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.quant import cache, tensors


def _roundtrip(folder, out):
    f = tensors.Folder(folder)
    for shard, names in f.shards():
        tensors.write_shard(out / shard.name, [(n, f.info[n].dtype, f.info[n].shape, f.copied(n)) for n in names])
    return f


def test_copy_of_an_ordinary_checkpoint_is_byte_for_byte_the_same_tensors(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    t = {"a.weight": torch.randn(5, 3, dtype=torch.bfloat16), "b": torch.arange(7, dtype=torch.int64),
         "c": torch.tensor(3.5), "d.weight_scale": torch.randn(4, 2).to(torch.float8_e4m3fn)}
    save_file(t, src / "model.safetensors")
    f = _roundtrip(src, out)
    back = load_file(out / "model.safetensors")
    assert set(back) == set(t)
    for k in t:
        assert back[k].dtype == t[k].dtype and torch.equal(back[k].reshape(-1).view(torch.uint8),
                                                           t[k].reshape(-1).view(torch.uint8)), k
    assert f.data_rows("a.weight") == [(0, 5)]  # every row of an ordinary file holds data
    assert torch.equal(f.get("a.weight", (1, 3)), t["a.weight"][1:3])


def _sparse(path, rows, cols, data_rows):
    """A one-tensor safetensors file: ``rows x cols`` bf16 whose first ``data_rows`` rows hold 1.0 and the rest is a
    hole."""
    n = rows * cols * 2
    raw = json.dumps({"w.weight": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [0, n]}}).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.write(torch.ones(data_rows, cols, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes())
        fh.truncate(8 + len(raw) + n)


def test_a_hole_reads_as_zeros_is_never_read_and_is_copied_as_a_hole(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    rows, cols = 4096, 1024  # 8 MiB: large enough to hold 4 KiB pages of hole after the data
    _sparse(src / "model.safetensors", rows, cols, 2)
    if os.stat(src / "model.safetensors").st_blocks * 512 > 4 * 2**20:
        pytest.skip("this file system does not keep holes")
    f = _roundtrip(src, out)
    (r0, r1), = f.data_rows("w.weight")
    assert r0 == 0 and 2 <= r1 < rows  # the data rows, rounded to the file system's blocks: not the whole tensor
    back = load_file(out / "model.safetensors")["w.weight"]
    assert torch.equal(back[:2], torch.ones(2, cols, dtype=torch.bfloat16)) and not back[r1:].any()
    assert os.stat(out / "model.safetensors").st_blocks * 512 < 2**20  # the copy kept the hole


def test_file_digest_is_plain_sha256_for_an_ordinary_file_and_fast_over_holes(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("LABS_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "plain.bin"
    p.write_bytes(os.urandom(3 * 2**20 + 5))
    assert cache.file_digest(p) == hashlib.sha256(p.read_bytes()).hexdigest()
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    _sparse(a, 4096, 1024, 2)
    _sparse(b, 4096, 1024, 3)
    assert cache.file_digest(a) != cache.file_digest(b)  # different data, different digest
