"""helpers.runtime (machine detection, profiles) and helpers.models (the embedded default model)."""

import json
import subprocess
import sys

import pytest

from helpers import models, runtime, settings
from helpers.runtime import GPU, Machine


def machine(*gpus, flags=frozenset({"avx2"}), node=None):
    return Machine(is_colab=False, gpus=tuple(gpus), cpu_count=2, memory_gib=24, cpu_flags=frozenset(flags),
                   node_memory_gib=node)


def test_parse_nvidia_smi_output():
    out = "NVIDIA H100 80GB HBM3, 81559, 9.0\nTesla T4, 15360, 7.5\n"
    gpus = runtime.parse_nvidia_smi(out)
    assert gpus[0] == GPU("NVIDIA H100 80GB HBM3", 81559 / 1024, (9, 0))
    assert gpus[1].compute_capability == (7, 5) and not gpus[1].supports_bf16
    assert gpus[0].supports_fp8 and not gpus[0].supports_fp4


@pytest.mark.parametrize("name,mem,cc,expected", [
    ("Tesla T4", 15, (7, 5), "colab-t4"),
    ("NVIDIA L4", 22.5, (8, 9), "l4"),
    ("NVIDIA A100-SXM4-80GB", 80, (8, 0), "a100"),
    ("NVIDIA H100 80GB HBM3", 80, (9, 0), "h100"),
    ("NVIDIA H200", 141, (9, 0), "h200"),
    ("NVIDIA B200", 180, (10, 0), "b200"),
    ("NVIDIA RTX A6000", 48, (8, 6), "a100"),   # unlisted: by memory and capability
    ("Quadro P5000", 16, (6, 1), "colab-t4"),   # no bf16: the fp16 profile
])
def test_choose_profile(name, mem, cc, expected):
    assert runtime.choose_profile(machine(GPU(name, mem, cc))) == expected


def test_cpu_profile_and_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("LABS_PROFILE", raising=False)
    monkeypatch.delenv("LABS_CPU_DTYPE", raising=False)
    prof = runtime.profile(machine=machine())
    assert prof.name == "cpu" and prof.model == models.DEFAULT_ID and prof.gpu_memory_gib is None
    from helpers.server import Server
    srv = Server.from_profile(prof, max_model_len=4096, env={"X": "1"}, api_key="k", engine_args={"max-num-seqs": 4})
    assert srv.engine_args["max_model_len"] == 4096 and srv.engine_args["max_num_seqs"] == 4
    assert srv.engine_args["optimization_level"] == 0 and srv.api_key == "k" and srv.served_model_name == "smollm2"
    assert srv.env == {**prof.env, "X": "1"} == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                                                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "X": "1"}
    (tmp_path / "config.json").write_text("{}")
    other = Server.from_profile(prof, model=tmp_path, served_model_name="w8a8")  # another checkpoint, same settings
    assert str(other.model_path) == str(tmp_path) and other.served_model_name == "w8a8"
    assert other.engine_args["dtype"] == prof.dtype

    assert prof.engine_args.get("max_model_len") is None  # the profile itself is untouched
    # The KV pool is set the way a GPU sets it: a share of memory, not a byte count vLLM would report back.
    assert "kv_cache_memory_bytes" not in prof.engine_args and "VLLM_CPU_KVCACHE_SPACE" not in prof.env


@pytest.mark.parametrize("flags,dtype", [
    ({"avx2"}, "float32"),                                   # AMD EPYC here: AVX2 only
    ({"avx2", "avx512f"}, "float32"),                        # AVX-512 without native bf16: bf16 is emulated
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
    ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, "bfloat16"),
])
def test_cpu_dtype_follows_the_cpus_instructions(flags, dtype, monkeypatch):
    monkeypatch.delenv("LABS_CPU_DTYPE", raising=False)
    prof = runtime.cpu_profile(machine(flags=flags))
    assert prof.dtype == dtype
    assert ("natively" in prof.why) == (dtype == "bfloat16")  # it says why
    monkeypatch.setenv("LABS_CPU_DTYPE", "bfloat16")
    assert runtime.cpu_profile(machine(flags=flags)).dtype == "bfloat16"
    monkeypatch.setenv("LABS_CPU_DTYPE", "fp8")
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        runtime.cpu_profile(machine(flags=flags))


def test_cpu_utilization_is_sized_from_the_memory_vllm_sees():
    # vLLM's CPU backend reads NUMA node 0's MemTotal; a VM here had 8.7 of its 23.5 GiB there.
    # The share is taken when a server starts (the node's figure moves on some VMs), so the profile carries GiB and
    # its explanation quotes the share for the machine it was fitted to.
    small, whole = runtime.cpu_profile(machine(node=8.7)), runtime.cpu_profile(machine())
    worker = small.engine_args["gpu_memory_utilization"]
    assert worker == runtime.WorkerMemory(runtime.CPU_WORKER_GIB)
    assert worker.share(8.7) == pytest.approx(runtime.CPU_WORKER_GIB / 8.7, abs=1e-3)
    assert f"({worker.share(8.7)} of the 8.7 GiB" in small.why
    assert f"({worker.share(24)} of the 24.0 GiB" in whole.why
    assert runtime.WorkerMemory(20).share(8.7) == 0.9  # never more than 90% of the node


def test_parse_cpuinfo():
    text = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f amx_bf16 vaes\n\n"
            "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f amx_bf16 vaes\n")
    name, flags = runtime.parse_cpuinfo(text)
    assert name == "AMD EPYC" and flags == {"avx2", "avx512f", "amx_bf16"}
    assert Machine(False, (), 2, 24, cpu_flags=flags).native_bf16


def test_every_gpu_profile_respects_its_gpu():
    t4 = runtime.PROFILES["colab-t4"]
    assert t4.dtype == "float16"  # T4 has no bf16
    for p in runtime.PROFILES.values():
        assert p.max_model_len <= 131072 and p.sizing_context >= 8192
        if p.device == "cuda":
            assert 0.5 < p.engine_args["gpu_memory_utilization"] < 0.95


def test_gpu_profile_on_cpu_machine_is_refused(monkeypatch):
    monkeypatch.setenv("LABS_PROFILE", "h100")
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        runtime.profile(machine=machine())
    monkeypatch.setenv("LABS_PROFILE", "nope")
    with pytest.raises(ValueError, match="unknown profile"):
        runtime.profile(machine=machine())


def test_quick(monkeypatch):
    monkeypatch.setenv("LABS_QUICK", "1")
    assert settings.quick()
    monkeypatch.setenv("LABS_QUICK", "0")
    assert not settings.quick()


def test_resolve():
    assert models.resolve("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert models.resolve("default") == models.resolve(None) == models.DEFAULT_ID
    assert models.served_name("default") == "smollm2" and models.served_name("Qwen/Qwen2.5-1.5B") == "Qwen2.5-1.5B"
    assert models.offline_env(models.DEFAULT_ID) == {"HF_HUB_OFFLINE": "1"}
    assert models.offline_env("Qwen/Qwen2.5-1.5B-Instruct") == {}  # a GPU machine may download it
    for bad in ("./nope", "/nope/x", "nope"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            models.resolve(bad)


def test_resolve_rejects_a_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.resolve(str(tmp_path))


def test_default_model_is_a_real_smollm2_checkpoint():
    path = models.default_model(quiet=True)
    cfg = json.loads((path / "config.json").read_text())
    # SmolLM2-135M: 30 layers, 9 query heads sharing 3 KV heads, head_dim 64, tied embeddings.
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (30, 9, 3)
    assert cfg["hidden_size"] == 576 and cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"]
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", "pt") as f:
        n = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert n == 134_515_008  # the published parameter count
    # ~269 MB of bf16 weights on disk: 2 bytes per parameter plus the header.
    assert abs((path / "model.safetensors").stat().st_size - 2 * n) < 1_000_000


def _prod(shape):
    out = 1
    for d in shape:
        out *= d
    return out


def test_default_model_chat_template_renders():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models.default_model(quiet=True))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_cli_prints_the_path():
    out = subprocess.run([sys.executable, "-m", "helpers.models", "path"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(models.default_model(quiet=True))


def test_default_model_resolves_by_hub_id_offline_as_a_gpu_model_would():
    """The CPU run takes the GPU path: huggingface_hub and transformers find the id in the cache, offline."""
    code = ("from huggingface_hub import snapshot_download; from transformers import AutoConfig, AutoTokenizer;"
            f"p = snapshot_download({models.DEFAULT_ID!r}); c = AutoConfig.from_pretrained({models.DEFAULT_ID!r});"
            f"t = AutoTokenizer.from_pretrained({models.DEFAULT_ID!r}); print(p, c.num_hidden_layers, len(t))")
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    path, layers, vocab = out.split()
    assert path == str(models.default_model(quiet=True)) and layers == "30" and int(vocab) == 49152
    assert models.local_path(models.DEFAULT_ID) == models.default_model(quiet=True)
    assert models.local_path("no-such-org/no-such-model") is None


def test_quantization_fetches_a_hub_model_a_fresh_runtime_has_not_downloaded_yet(tmp_path, monkeypatch):
    """Labs 12-14 and 17 read the model's files before any server pulled it: every Colab badge opens a fresh runtime,
    and `quant.model_dir` used to refuse ('quantization never downloads'). It downloads now, except offline."""
    import huggingface_hub

    from helpers import quant

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def fake_download(repo_id, allow_patterns=None, **kw):
        calls.append((repo_id, tuple(allow_patterns or ())))
        snap = tmp_path / "hf" / "hub" / "snap"
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").write_text("{}")
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    got = quant.model_dir("Qwen/Qwen2.5-1.5B-Instruct")
    assert (got / "config.json").is_file() and calls == [("Qwen/Qwen2.5-1.5B-Instruct", models.FETCH_PATTERNS)]
    assert "*.safetensors" in calls[0][1] and not any("original" in p or p.endswith(".pth") for p in calls[0][1])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        quant.model_dir("meta-llama/Llama-3.1-8B-Instruct")
    assert len(calls) == 1


# Cards as nvidia-smi names them, with the memory it reports (MiB / 1024) and their compute capability.
CARDS_SEEN = [
    ("NVIDIA A100-SXM4-40GB", 40960 / 1024, (8, 0), "a100-40gb", "a100"),
    ("NVIDIA A100-SXM4-80GB", 81920 / 1024, (8, 0), "a100", "a100"),
    ("NVIDIA A100 80GB PCIe", 81920 / 1024, (8, 0), "a100", "a100"),
    ("NVIDIA H100 PCIe", 81559 / 1024, (9, 0), "h100-pcie", "h100"),
    ("NVIDIA H100 80GB HBM3", 81559 / 1024, (9, 0), "h100", "h100"),
    ("NVIDIA A10G", 23028 / 1024, (8, 6), "a10g", "l4"),
    ("NVIDIA L40S", 46068 / 1024, (8, 9), "l40s", "a100"),
    ("NVIDIA GeForce RTX 4090", 24564 / 1024, (8, 9), "rtx4090", "l4"),
    ("Tesla T4", 15360 / 1024, (7, 5), "t4", "colab-t4"),
]


@pytest.mark.parametrize("name,mem,cc,key,expected", CARDS_SEEN, ids=[c[3] + ":" + c[0] for c in CARDS_SEEN])
def test_each_card_runs_its_profile_planned_on_its_own_memory(name, mem, cc, key, expected, monkeypatch):
    from helpers import plan, sizing

    monkeypatch.delenv("LABS_PROFILE", raising=False)
    assert runtime.card_kind(name, mem) == (key, expected)
    prof = runtime.profile(machine=machine(GPU(name, mem, cc)))
    assert prof.name == expected and prof.gpu_memory_gib == mem and prof.hardware == key
    assert sizing.hardware(name) is sizing.HARDWARE[key]  # the name alone finds the same catalog entry
    for number in sorted(plan.LABS):  # every lab fits the card's own memory, not its profile's reference card's
        p = plan.lab(number, prof, quick=False)
        assert all(c["ok"] for c in p.as_dict()["checks"]), number


def test_an_a100s_memory_tells_40gb_from_80gb_when_the_name_does_not():
    assert runtime.card_kind("NVIDIA A100-PCIE", 39.4) == ("a100-40gb", "a100")
    assert runtime.card_kind("NVIDIA A100-PCIE", 79.2) == ("a100", "a100")
    assert runtime.card_kind("NVIDIA A100-PCIE") == ("a100", "a100")  # no memory, no size in the name: the 80GB card
    assert runtime.card_kind("NVIDIA RTX A6000", 48) is None
