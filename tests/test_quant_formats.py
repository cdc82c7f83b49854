"""helpers.quant without llm-compressor: grids, fake quantization against independent references, recipes, the
device and group-size checks, the cache's lock and atomic rename, and fake-quantized checkpoints. Seconds."""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import quant, runtime
from helpers.quant import cache, formats
from helpers.runtime import GPU, Machine

CPU = Machine(is_colab=False, gpus=(), cpu_count=2, memory_gib=24.0, cpu_flags=frozenset({"avx2", "avx512f"}))
CPU_AVX2 = Machine(is_colab=False, gpus=(), cpu_count=2, memory_gib=24.0, cpu_flags=frozenset({"avx2"}))


def _gpu(name: str, cc: tuple[int, int]) -> Machine:
    return Machine(is_colab=False, gpus=(GPU(name, 80.0, cc),), cpu_count=8, memory_gib=64.0)


# ------------------------------------------------------------------------------------------- grids
def _torch_grid(dtype: torch.dtype) -> list[float]:
    """Every finite value of a torch float8 dtype, by decoding all 256 bit patterns."""
    vals = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return sorted({float(v) for v in vals if torch.isfinite(v)})


def test_fp8_grids_are_torchs_own_float8_values():
    e4m3, e5m2 = quant.grid("fp8_e4m3"), quant.grid("fp8_e5m2")
    assert e4m3.tolist() == _torch_grid(torch.float8_e4m3fn)
    assert e5m2.tolist() == _torch_grid(torch.float8_e5m2)
    assert (len(e4m3), float(e4m3.max())) == (253, 448.0)      # no infinities: S.1111.111 alone is NaN
    assert (len(e5m2), float(e5m2.max())) == (247, 57344.0)    # IEEE-style: top exponent is inf/NaN


def test_fp4_and_integer_grids():
    expected = [-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]
    for fmt in ("nvfp4", "mxfp4"):
        assert quant.grid(fmt).tolist() == expected
    assert quant.grid("int8").tolist() == list(range(-128, 128))
    assert quant.grid("int4").tolist() == list(range(-8, 8))


# ------------------------------------------------------------------------ FP8 against torch's casts
@pytest.mark.parametrize("fmt,dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_rounding_matches_torch_float8_casts_including_ties_and_subnormals(fmt, dtype):
    g = quant.grid(fmt)
    mids = ((g[1:] + g[:-1]) / 2).float()                       # every tie between neighbours
    torch.manual_seed(0)
    spread = torch.randn(20000) * torch.pow(10.0, torch.empty(20000).uniform_(-4, 3))
    x = torch.cat([mids, spread.clamp(-float(g.max()), float(g.max())), g.float()])
    assert torch.equal(quant.round_to_grid(x, fmt), x.to(dtype).float())


@pytest.mark.parametrize("fmt,dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
@pytest.mark.parametrize("granularity", ["tensor", "channel"])
def test_fp8_fake_quantize_matches_a_scaled_torch_cast(fmt, dtype, granularity):
    torch.manual_seed(1)
    w = torch.randn(64, 256) * torch.rand(64, 1) * 3
    q = quant.quantize(w, fmt, granularity=granularity)
    amax = w.abs().amax() if granularity == "tensor" else w.abs().amax(dim=1, keepdim=True)
    scale = amax / float(quant.grid(fmt).max())
    ref = (w / scale).to(dtype).float() * scale
    assert torch.equal(q.dequantized, ref)
    assert q.scale.numel() == (1 if granularity == "tensor" else 64)


# ------------------------------------------------------------- FP4 and INT against numpy references
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def _np_fp4(x: np.ndarray) -> np.ndarray:
    """Nearest E2M1 magnitude by exhaustive search; a tie goes to the value whose mantissa bit is 0 (even)."""
    a = np.minimum(np.abs(x), 6.0)
    d = np.abs(a[..., None] - _E2M1)
    best = d.min(axis=-1, keepdims=True)
    odd_mantissa = np.arange(8) % 2  # index 2e+m: 0, 1, 2, 4 have mantissa bit 0; 0.5, 1.5, 3, 6 have 1
    cand = np.where(d == best, odd_mantissa, 9)    # a tie lies between neighbours: the even one wins
    return np.sign(x) * _E2M1[cand.argmin(axis=-1)]


def _np_e4m3(x: np.ndarray) -> np.ndarray:
    grid = np.array(_torch_grid(torch.float8_e4m3fn))
    pos = grid[grid >= 0]
    a = np.minimum(np.abs(x), 448.0)
    idx = np.abs(a[..., None] - pos).argmin(axis=-1)  # ties: tested above against torch; none occur in this data
    return np.sign(x) * pos[idx]


def test_fp4_rounding_matches_an_exhaustive_numpy_search():
    x = np.concatenate([np.linspace(-7, 7, 2801), (_E2M1[1:] + _E2M1[:-1]) / 2, -(_E2M1[1:] + _E2M1[:-1]) / 2])
    ours = quant.round_to_grid(torch.tensor(x, dtype=torch.float32), "nvfp4").double().numpy()
    assert np.array_equal(ours, _np_fp4(x))


def test_nvfp4_matches_an_independent_numpy_implementation():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((32, 128)).astype(np.float32) * rng.uniform(0.01, 2, (32, 1)).astype(np.float32)
    q = quant.quantize(torch.from_numpy(w), "nvfp4")
    gs = np.float32(448.0 * 6.0) / np.abs(w).max()
    blocks = w.reshape(32, 8, 16)
    bscale = _np_e4m3(gs * (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(6.0)))
    eff = (bscale / gs).astype(np.float32)
    values = _np_fp4(blocks / eff)
    assert np.array_equal(q.values.numpy(), values.reshape(32, 128))
    assert np.array_equal(q.scale.numpy(), bscale.squeeze(-1))
    assert np.allclose(q.dequantized.numpy(), (values * eff).reshape(32, 128), rtol=1e-6, atol=0)


def test_mxfp4_matches_the_ocp_spec_in_numpy():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 256)).astype(np.float32)
    q = quant.quantize(torch.from_numpy(w), "mxfp4")
    blocks = w.reshape(16, 8, 32)
    shared = np.floor(np.log2(np.abs(blocks).max(axis=-1, keepdims=True))) - 2
    ref = (_np_fp4(blocks / 2.0 ** shared) * 2.0 ** shared).reshape(16, 256)
    assert np.array_equal(q.dequantized.numpy(), ref.astype(np.float32))
    assert set(np.log2(q.scale.numpy()).ravel()) <= set(range(-127, 128))  # powers of two: E8M0


@pytest.mark.parametrize("fmt,qmin,qmax", [("int8", -128, 127), ("int4", -8, 7)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_integer_rtn_matches_numpy(fmt, qmin, qmax, symmetric):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    q = quant.quantize(torch.from_numpy(w), fmt, granularity="group", group_size=32, symmetric=symmetric)
    g = w.reshape(8, 4, 32)
    lo, hi = np.minimum(g.min(-1, keepdims=True), 0), np.maximum(g.max(-1, keepdims=True), 0)
    if symmetric:
        s = np.maximum(-lo, hi) / np.float32((qmax - qmin) / 2)
        codes = np.clip(np.round(g / s), qmin, qmax)
        ref = codes * s
    else:
        s = (hi - lo) / np.float32(qmax - qmin)
        zp = np.round(np.clip(qmin - lo / s, qmin, qmax))
        codes = np.clip(np.round(g / s + zp), qmin, qmax)
        ref = (codes - zp) * s
    assert np.array_equal(q.values.numpy(), codes.reshape(8, 128))
    assert np.allclose(q.dequantized.numpy(), ref.reshape(8, 128), rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_stored_values_lie_on_the_formats_grid(fmt):
    torch.manual_seed(5)
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    kw = {"granularity": "group", "group_size": 32} if fmt.startswith("int") else {}
    vals = set(quant.quantize(w, fmt, **kw).values.double().unique().tolist())
    assert vals <= set(quant.grid(fmt).tolist())


def test_error_ordering_on_gaussian_weights():
    """Same tensor: E4M3 (3 mantissa bits) beats E5M2 (2); NVFP4 (16-blocks, E4M3 scales) beats MXFP4 (32-blocks,
    power-of-two scales); 8 bits beat 4."""
    torch.manual_seed(6)
    w = torch.randn(512, 1024)
    e = {f: quant.error_stats(w, quant.fake_quantize(w, f)) for f in ("fp8_e4m3", "fp8_e5m2", "nvfp4", "mxfp4")}
    assert e["fp8_e4m3"].mse < e["fp8_e5m2"].mse < e["nvfp4"].mse < e["mxfp4"].mse
    assert e["fp8_e4m3"].max_abs < e["fp8_e5m2"].max_abs
    assert e["nvfp4"].sqnr_db > e["mxfp4"].sqnr_db


def test_bad_format_arguments_are_refused():
    w = torch.randn(4, 48)
    with pytest.raises(ValueError, match="multiples of 32"):
        quant.quantize(w, "mxfp4")
    with pytest.raises(ValueError, match="group_size"):
        quant.quantize(w, "int4", granularity="group")
    with pytest.raises(ValueError, match="unknown format"):
        quant.quantize(w, "fp6")


# ----------------------------------------------------------------------------------------- recipes
def _fake_model(folder: Path, hidden: int = 576, inter: int = 1536) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    t = {"model.embed_tokens.weight": torch.zeros(8, hidden), "model.norm.weight": torch.zeros(hidden)}
    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
        t[f"model.layers.0.self_attn.{p}.weight"] = torch.zeros(4, hidden)
    t["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(inter, hidden)
    t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(inter, hidden)
    t["model.layers.0.mlp.down_proj.weight"] = torch.zeros(hidden, inter)
    save_file(t, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden, "intermediate_size": inter}))
    return folder


def test_group_size_128_is_refused_naming_the_dimension_and_what_works(tmp_path):
    model = _fake_model(tmp_path / "m")
    with pytest.raises(ValueError) as e:
        quant.check_group_size(model, quant.W4A16_GPTQ.with_group_size(128))
    msg = str(e.value)
    assert "576 input columns" in msg and "q_proj" in msg and "down_proj" not in msg.split("Group sizes")[0]
    assert "16, 32, 64." in msg and "with_group_size(64)" in msg
    quant.check_group_size(model, quant.W4A16_GPTQ.with_group_size(64))
    quant.check_group_size(model, quant.W8A8_RTN)  # per channel: nothing to divide


def test_recipes_validate_and_hash_canonically():
    with pytest.raises(ValueError, match="group_size"):
        quant.Recipe("x", "W4A16")
    with pytest.raises(ValueError, match="GPTQ"):
        quant.Recipe("x", "W8A8", actorder="static")
    with pytest.raises(ValueError, match="fixes its blocks"):
        quant.Recipe("x", "NVFP4", group_size=32)
    a = quant.W4A16_GPTQ
    assert a.canonical_json() == quant.Recipe("renamed", "W4A16", algorithm="gptq", group_size=64,
                                              actorder="static").canonical_json()
    assert a.canonical_json() != quant.W4A16_GPTQ_NO_ACTORDER.canonical_json()
    assert quant.W4A16_GPTQ.needs_calibration and not quant.W8A8_RTN.needs_calibration
    assert quant.W8A8_SQ_GPTQ.needs_calibration and not quant.FP8_DYNAMIC.needs_calibration


@pytest.mark.parametrize("machine,refused,allowed", [
    (CPU, ["fp8-dynamic", "nvfp4", "mxfp4a16"], ["w8a8-rtn", "w4a16-gptq-g64"]),
    (CPU_AVX2, ["fp8-dynamic", "nvfp4", "w4a16-gptq-g64", "w4a16-rtn-g64"], ["w8a8-rtn", "w8a8-sq-gptq"]),
    (_gpu("Tesla T4", (7, 5)), ["fp8-dynamic", "nvfp4"], ["w8a8-sq-gptq", "w4a16-awq-g64"]),
    (_gpu("NVIDIA H100", (9, 0)), ["nvfp4", "mxfp4"], ["fp8-dynamic", "w8a8-rtn"]),
    (_gpu("NVIDIA B200", (10, 0)), [], ["fp8-dynamic", "nvfp4", "mxfp4", "w4a16-gptq-g64"]),
])
def test_serving_checks_follow_the_device(machine, refused, allowed):
    for name in refused:
        with pytest.raises(quant.UnservableError) as e:
            quant.check_servable(quant.recipe(name), machine)
        assert "instead" in str(e.value)
    for name in allowed:
        quant.check_servable(quant.recipe(name), machine)


def test_cpu_refusals_name_the_alternative():
    with pytest.raises(quant.UnservableError, match="W8A8 INT8.*CPUInt8ScaledMMLinearKernel"):
        quant.check_servable(quant.FP8_DYNAMIC, CPU)
    with pytest.raises(quant.UnservableError, match="W4A16.*fake_quantized_checkpoint"):
        quant.check_servable(quant.NVFP4, CPU)
    with pytest.raises(quant.UnservableError, match="FP8"):
        quant.check_servable(quant.NVFP4, _gpu("NVIDIA H100", (9, 0)))
    with pytest.raises(quant.UnservableError, match="AVX-512.*cpu_gemm_wna16.*W8A8 INT8"):
        quant.check_servable(quant.W4A16_GPTQ, CPU_AVX2)
    with pytest.raises(quant.UnservableError, match="Serve W8A8 INT8"):  # not W4A16: this CPU cannot serve it
        quant.check_servable(quant.MXFP4, CPU_AVX2)


def _checkpoint_config(folder, weights) -> None:
    """A checkpoint folder's config.json as compressed-tensors writes it (``weights`` None: unquantized)."""
    cfg = {"model_type": "llama"}
    if weights:
        cfg["quantization_config"] = {"quant_method": "compressed-tensors",
                                      "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("weights,fmt,refused", [
    ({"type": "float", "num_bits": 8, "strategy": "channel"}, "fp8", True),
    ({"type": "float", "num_bits": 4, "group_size": 16, "strategy": "tensor_group"}, "nvfp4", True),
    ({"type": "float", "num_bits": 4, "group_size": 32, "strategy": "group"}, "mxfp4", True),
    ({"type": "int", "num_bits": 8, "strategy": "channel"}, "int8", False),
    ({"type": "int", "num_bits": 4, "group_size": 64, "strategy": "group"}, "int4", False),  # AVX-512 CPU
    (None, None, False),
])
def test_a_checkpoint_folder_is_checked_by_its_config(tmp_path, weights, fmt, refused):
    _checkpoint_config(tmp_path, weights)
    assert quant.checkpoint_format(tmp_path) == fmt
    if refused:
        with pytest.raises(quant.UnservableError, match="instead"):
            quant.check_servable(tmp_path, CPU)
    else:
        quant.check_servable(tmp_path, CPU)


@pytest.mark.parametrize("weights,dtype,served", [
    ({"type": "int", "num_bits": 8, "strategy": "channel"}, "float32", "bfloat16"),    # the INT8 kernel: half only
    ({"type": "int", "num_bits": 4, "group_size": 64, "strategy": "group"}, "float32", "bfloat16"),  # INT4: the same
    ({"type": "int", "num_bits": 8, "strategy": "channel"}, "bfloat16", "bfloat16"),
    ({"type": "int", "num_bits": 4, "group_size": 64, "strategy": "group"}, "float16", "float16"),  # a T4
    (None, "float32", "float32"),                                                      # plain weights: as profiled
])
def test_a_float32_profile_serves_int8_and_int4_checkpoints_in_bf16(tmp_path, weights, dtype, served):
    _checkpoint_config(tmp_path, weights)
    prof = runtime.profile("cpu").replace(dtype=dtype)
    out = quant.serving_profile(prof, tmp_path)
    assert out.model == str(tmp_path) and out.dtype == served
    assert prof.dtype == dtype                                                        # the lab's own profile unchanged


def test_missing_quant_environment_says_make_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_QUANT_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(quant.QuantEnvMissing, match="make setup"):
        quant.quant_python()
    monkeypatch.delenv("LABS_QUANT_PYTHON")
    (tmp_path / "labs").mkdir()
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("LABS_HOME", str(tmp_path))
    with pytest.raises(quant.QuantEnvMissing, match=r"\.venv-quant.*make setup"):
        quant.quant_python()


# --------------------------------------------------------------------------------------- the cache
def _slow_make(out: Path) -> dict:
    time.sleep(1.0)
    (out / "model.safetensors").write_bytes(b"x" * 100)
    return {"pid": __import__("os").getpid()}


def _build_in_process(cache_dir: str, q) -> None:
    import os

    os.environ["LABS_CACHE"] = cache_dir
    c = cache.build_once("demo", "k1", _slow_make, kind="test", source_model="m", recipe={})
    q.put((c.cache_hit, str(c.path), c.details["pid"]))


def test_two_processes_build_a_checkpoint_once(tmp_path):
    ctx = mp.get_context("fork")  # two real processes, each taking the file lock
    q = ctx.Queue()
    ps = [ctx.Process(target=_build_in_process, args=(str(tmp_path), q)) for _ in range(2)]
    for p in ps:
        p.start()
    results = [q.get(timeout=60) for _ in ps]
    for p in ps:
        p.join(timeout=30)
    assert sorted(hit for hit, _, _ in results) == [False, True]       # one built, the other waited and found it
    assert len({path for _, path, _ in results}) == 1 and len({pid for *_, pid in results}) == 1


def test_a_failed_build_leaves_nothing_and_a_stale_temp_folder_is_cleared(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_CACHE", str(tmp_path))

    def boom(out: Path) -> dict:
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("died mid-build")

    with pytest.raises(RuntimeError):
        cache.build_once("demo", "k2", boom, kind="test", source_model="m", recipe={})
    qdir = cache.quantized_dir()
    assert not cache.cached("demo", "k2").exists() and not list(qdir.glob(".tmp-*"))
    stale = qdir / ".tmp-demo-k2-999999"  # what a SIGKILLed builder leaves
    stale.mkdir()
    t0 = time.perf_counter()
    c = cache.build_once("demo", "k2", lambda out: (out / "a.safetensors").write_bytes(b"1234") and {}, kind="test",
                         source_model="m", recipe={})
    assert not stale.exists() and c.weight_bytes == 4 and not c.cache_hit
    assert cache.build_once("demo", "k2", boom, kind="test", source_model="m", recipe={}).cache_hit
    assert cache.build_once("renamed", "k2", boom, kind="test", source_model="m", recipe={}).path == c.path  # key wins
    assert time.perf_counter() - t0 < 2


def test_file_digest_is_content_and_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    d1 = cache.file_digest(f)
    assert d1 == __import__("hashlib").sha256(b"abc").hexdigest()
    time.sleep(0.01)
    f.write_bytes(b"abd")
    assert cache.file_digest(f) != d1


# ------------------------------------------------------------------------- fake-quantized checkpoint
def _tiny_llama(folder: Path, hidden: int = 64, inter: int = 128, layers: int = 2) -> Path:
    """A Llama-shaped safetensors checkpoint (random weights, untied LM head) without importing transformers."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(7)
    t = {"model.embed_tokens.weight": torch.randn(100, hidden, generator=g).bfloat16(),
         "lm_head.weight": torch.randn(100, hidden, generator=g).bfloat16(),
         "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for i in range(layers):
        pre = f"model.layers.{i}"
        for p, shape in (("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (hidden // 2, hidden)),
                         ("self_attn.v_proj", (hidden // 2, hidden)), ("self_attn.o_proj", (hidden, hidden)),
                         ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                         ("mlp.down_proj", (hidden, inter))):
            t[f"{pre}.{p}.weight"] = (torch.randn(*shape, generator=g) * 0.05).bfloat16()
        t[f"{pre}.input_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        t[f"{pre}.post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    folder.mkdir(parents=True)
    save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": hidden}))
    return folder


def test_fake_quantized_checkpoint_rounds_linear_weights_only(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setenv("LABS_CACHE", str(tmp_path / "cache"))
    src = _tiny_llama(tmp_path / "tiny")
    ckpt = quant.fake_quantized_checkpoint(src, "nvfp4")
    before, after = load_file(src / "model.safetensors"), load_file(ckpt.path / "model.safetensors")
    assert before.keys() == after.keys() and (ckpt.path / "config.json").is_file()
    for name, w in before.items():
        if name.endswith("proj.weight"):
            module = name.rsplit(".", 2)[0]
            group = ("q_proj", "k_proj", "v_proj") if "self_attn" in name and "o_proj" not in name else \
                ("gate_proj", "up_proj") if "gate_proj" in name or "up_proj" in name else (name.split(".")[-2],)
            gs = min(quant.nvfp4_global_scale(before[f"{module}.{g}.weight"]) for g in group)
            assert torch.equal(after[name], quant.fake_quantize(w, "nvfp4", global_scale=gs)), name
            assert not torch.equal(after[name], w)
        else:  # embeddings, lm_head, norms
            assert torch.equal(after[name], w), name
    assert ckpt.details["layers"] == 14 and 0 < ckpt.details["error"]["rel_rmse"] < 0.2
    again = quant.fake_quantized_checkpoint(src, "nvfp4")
    assert again.cache_hit and again.path == ckpt.path
    other = quant.fake_quantized_checkpoint(src, "fp8_e4m3", quantize_embeddings=True)
    assert other.path != ckpt.path
    assert not torch.equal(load_file(other.path / "model.safetensors")["model.embed_tokens.weight"],
                           before["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="group size 48"):
        quant.fake_quantized_checkpoint(src, "int4", group_size=48)
