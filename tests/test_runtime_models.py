"""helpers.runtime (machine detection, profiles) and helpers.models (the embedded default model)."""

import json
import subprocess
import sys

import pytest

from helpers import models, runtime
from helpers.runtime import GPU, Machine


def machine(*gpus):
    return Machine(is_colab=False, gpus=tuple(gpus), cpu_count=2, memory_gib=24)


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


def test_cpu_profile_and_overrides(monkeypatch):
    monkeypatch.delenv("LABS_PROFILE", raising=False)
    prof = runtime.profile(machine=machine())
    assert prof.name == "cpu" and prof.model == "default" and prof.dtype == "bfloat16"
    kw = prof.server_kwargs(max_model_len=4096, env={"X": "1"})
    assert kw["engine_args"]["max_model_len"] == 4096
    assert kw["engine_args"]["optimization_level"] == 0
    assert kw["env"] == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "X": "1"}
    assert prof.engine_args.get("max_model_len") is None  # the profile itself is untouched


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
    assert runtime.quick()
    monkeypatch.setenv("LABS_QUICK", "0")
    assert not runtime.quick()


def test_resolve():
    assert models.resolve("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
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
    assert out.stdout.strip() == str(models.default_model_dir())
