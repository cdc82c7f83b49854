"""A rehearsal's world: a folder standing in for everything a GPU machine has that this one does not.

- ``bin/nvidia-smi``: the rehearsed card's answers (:func:`ci.rehearse.cards.nvidia_smi`), so ``helpers.runtime``
  detects it exactly as on the machine;
- ``hf/hub``: a Hugging Face cache holding each profile's model as a download leaves it: the shipped config
  (``data/configs``), the shipped default model's tokenizer standing in for the model's own (said so in the snapshot's
  ``STANDIN.md``: its vocabulary is smaller, which nothing the labs do depends on), and safetensors files whose headers
  give every tensor's name, dtype and shape while their data are holes (sparse files: gigabytes on paper, nothing on
  disk); the project's own default model is linked in;
- ``quant-env/``: the quantization environment (its interpreter is :mod:`ci.rehearse.quant`);
- its own ``LABS_CACHE`` (process registry, quantized checkpoints, logs) and ``LABS_REPORTS`` (a rehearsal writes no
  report of the project's); the random tiny models are shared with the real cache (they are real, and keyed by
  content).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import sys
from pathlib import Path

from . import cards

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"

#: The models a rehearsal's hub cache holds: every profile's model.
HUB_MODELS = {"NousResearch/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
              "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b-instruct"}


def _default_snapshot() -> Path:
    hub = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
    repo = hub / "models--llm-serving-labs--smollm2-135m-instruct"
    ref = repo / "refs" / "main"
    if not ref.is_file():
        raise FileNotFoundError(f"the default model is not in the hub cache ({repo}): run `make setup` first")
    return repo / "snapshots" / ref.read_text().strip()


def llama_tensors(cfg: dict) -> list[tuple[str, str, list[int]]]:
    """(name, safetensors dtype, shape) of every tensor a Llama/Qwen2/Mistral checkpoint of ``cfg`` holds."""
    h, L, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or h // heads
    inter = cfg["intermediate_size"]
    dt = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[str(cfg.get("torch_dtype") or "bfloat16")]
    bias = cfg.get("model_type") == "qwen2"
    out = [("model.embed_tokens.weight", dt, [v, h])]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", dt, [h]), (p + "post_attention_layernorm.weight", dt, [h]),
                (p + "self_attn.q_proj.weight", dt, [heads * hd, h]), (p + "self_attn.k_proj.weight", dt, [kv * hd, h]),
                (p + "self_attn.v_proj.weight", dt, [kv * hd, h]), (p + "self_attn.o_proj.weight", dt, [h, heads * hd]),
                (p + "mlp.gate_proj.weight", dt, [inter, h]), (p + "mlp.up_proj.weight", dt, [inter, h]),
                (p + "mlp.down_proj.weight", dt, [h, inter])]
        if bias:
            out += [(p + "self_attn.q_proj.bias", dt, [heads * hd]), (p + "self_attn.k_proj.bias", dt, [kv * hd]),
                    (p + "self_attn.v_proj.bias", dt, [kv * hd])]
    out.append(("model.norm.weight", dt, [h]))
    if not cfg.get("tie_word_embeddings"):
        out.append(("lm_head.weight", dt, [v, h]))
    return out


_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


#: Rows of each matrix written with real values (the rest is a hole): the rows labs 12 and 13 sample at rehearsal size
#: ("the first whole rows" of a tensor), so their error statistics have weights to work on.
DATA_ROWS = 4


def write_sparse_safetensors(path: Path, tensors: list[tuple[str, str, list[int]]], seed: int = 0) -> int:
    """A safetensors file whose header is real and whose data is a hole but for each matrix's first
    :data:`DATA_ROWS` rows (weights drawn like a trained model's, sigma 0.02) and each vector (norms: ones); returns
    its size in bytes."""
    import numpy as np

    header, offset = {}, 0
    for name, dt, shape in tensors:
        n = _BYTES[dt]
        for d in shape:
            n *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, dt, shape in tensors:
            fh.seek(8 + len(raw) + header[name]["data_offsets"][0])
            count = shape[0] if len(shape) == 1 else min(shape[0], DATA_ROWS) * shape[1]
            values = np.ones(count, np.float32) if len(shape) == 1 else rng.normal(0, 0.02, count).astype(np.float32)
            if dt == "BF16":  # round to nearest even, keep the top 16 bits
                bits = values.view(np.uint32)
                fh.write(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes())
            else:
                fh.write(values.astype({"F16": np.float16, "F32": np.float32}[dt]).tobytes())
        fh.truncate(8 + len(raw) + offset)
    return 8 + len(raw) + offset


def standin_snapshot(hub: Path, repo_id: str, config_name: str, shard_bytes: int = 5 * 10**9) -> Path:
    """``repo_id``'s snapshot in ``hub`` as a download leaves it, with a shipped config and sparse weights."""
    cfg = json.loads((DATA / "configs" / f"{config_name}.json").read_text())
    cfg.setdefault("torch_dtype", "bfloat16")
    rev = hashlib.sha1(f"{repo_id}:{json.dumps(cfg, sort_keys=True)}:standin:{DATA_ROWS}".encode()).hexdigest()
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / rev
    if (snap / "model.safetensors.index.json").is_file():
        return snap
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(cfg, indent=2))
    tok = _default_snapshot()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (tok / f).is_file():
            shutil.copy(tok / f, snap / f)
    (snap / "STANDIN.md").write_text(
        f"# {repo_id} as a rehearsal's download\n\nThe config is the project's shipped copy "
        f"(data/configs/{config_name}.json). The tokenizer is the project's default model's (SmolLM2-135M-Instruct), "
        "standing in for this model's own: prompts and counts are right for it, not for the real tokenizer. The "
        "weights are safetensors headers with the model's tensor names, dtypes and shapes over holes: a sparse file "
        "of the right size, all zeros when read.\n")
    tensors, shards, cur, size = llama_tensors(cfg), [], [], 0
    for t in tensors:
        n = _BYTES[t[1]]
        for d in t[2]:
            n *= d
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        total += write_sparse_safetensors(snap / name, shard, seed=i)
        weight_map.update({t[0]: name for t in shard})
    (snap / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=1))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    return snap


def shared_dir() -> Path:
    """What every rehearsal on this machine shares: the stand-in downloads (sparse, built once, keyed by content) and
    the quantized checkpoints built from them (``quantized/``, keyed by content as the labs key theirs)."""
    base = Path(os.environ.get("LABS_CACHE") or Path.home() / ".cache" / "llm-serving-labs") / "rehearsal"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _script(path: Path, body: str) -> None:
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def build(folder: Path, machine: cards.Machine) -> dict[str, str]:
    """Make ``folder`` a rehearsal's world for ``machine``; returns the environment the labs run with."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(machine.to_json())
    bin_ = folder / "bin"
    bin_.mkdir(exist_ok=True)
    py = sys.executable
    _script(bin_ / "nvidia-smi", f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{py}" -m ci.rehearse.nvidia_smi "$@"\n')
    qenv = folder / "quant-env"
    site = qenv / "lib" / "python3.11" / "site-packages"
    for dist in ("llmcompressor-0.14.0.1", "torch-2.13.0+cu130", "lm_eval-0.4.13", "compressed_tensors-0.19.0"):
        (site / f"{dist}.dist-info").mkdir(parents=True, exist_ok=True)
    (qenv / "bin").mkdir(parents=True, exist_ok=True)
    _script(qenv / "bin" / "python", f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{py}" -m ci.rehearse.quant "$@"\n')
    hub = folder / "hf" / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    default = _default_snapshot().parent.parent
    link = hub / default.name
    if not link.exists():
        link.symlink_to(default)
    shared = shared_dir() / "hub"
    for repo_id, cfg in HUB_MODELS.items():
        snap = standin_snapshot(shared, repo_id, cfg)
        repo = snap.parent.parent
        if not (hub / repo.name).exists():
            (hub / repo.name).symlink_to(repo)
    cache = folder / "cache"
    cache.mkdir(exist_ok=True)
    real_models = Path(os.environ.get("LABS_CACHE") or Path.home() / ".cache" / "llm-serving-labs") / "models"
    real_models.mkdir(parents=True, exist_ok=True)
    if not (cache / "models").exists():
        (cache / "models").symlink_to(real_models)
    quantized = shared_dir() / "quantized"
    quantized.mkdir(exist_ok=True)
    if not (cache / "quantized").exists():
        (cache / "quantized").symlink_to(quantized)
    (folder / "reports").mkdir(exist_ok=True)
    (folder / "runs").mkdir(exist_ok=True)
    return {
        "PATH": f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "LABS_CACHE": str(cache), "LABS_REPORTS": str(folder / "reports"), "LABS_RUNS": str(folder / "runs"),
        "LABS_QUANT_PYTHON": str(folder / "quant-env" / "bin" / "python"),
        "LABS_VLLM_ENTRYPOINT": "ci.rehearse.standin", "LABS_GPU_PROBE": "ci.rehearse.gpu_probe",
        "LABS_REHEARSAL": "1", "LABS_HEADLESS": "1", "LABS_QUICK": "0", "LABS_PROFILE": machine.profile or "",
        "REHEARSAL_MACHINE": str(folder / "machine.json"), "REHEARSAL_HOME": str(folder),
        "STANDIN_SPEED": os.environ.get("STANDIN_SPEED", "1"),
    }
