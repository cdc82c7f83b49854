"""A model folder as vLLM reads it: config, the tensors' shapes and bytes (headers only), quantization, tokenizer.

The stand-in never loads a weight. It reads what vLLM's profiler would measure — the bytes the weights take once
loaded — from the safetensors headers, so a rehearsal's checkpoints can be sparse files of the right sizes.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1, "F8_E8M0": 1, "F4": 0.5}
TORCH_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "auto": None}


class ModelNotFound(OSError):
    pass


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return home / "hub"


def resolve(model: str) -> Path:
    """A local folder, or a hub id's snapshot in the hub cache (vLLM would download it; a rehearsal put it there)."""
    p = Path(model)
    if p.is_dir():
        return p
    repo = hub_cache() / f"models--{model.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    if snaps:
        return snaps[-1]
    # vLLM's own words when the hub is unreachable (huggingface_hub's LocalEntryNotFoundError under HF_HUB_OFFLINE)
    raise ModelNotFound(f"We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                        f"in the cached files. Cannot find an appropriate cached snapshot folder for the specified "
                        f"revision on the local disk and outgoing traffic has been disabled: {model}")


def tensors(folder: Path) -> dict[str, tuple[str, list[int], int]]:
    """Every tensor of the folder's safetensors files: name -> (dtype, shape, bytes), from the headers alone."""
    out: dict[str, tuple[str, list[int], int]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = meta["data_offsets"]
            out[name] = (meta["dtype"], list(meta["shape"]), end - start)
    return out


@dataclass
class Checkpoint:
    """What the stand-in knows of a served model."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, tuple[str, list[int], int]] = field(default_factory=dict)

    @classmethod
    def load(cls, model: str) -> "Checkpoint":
        folder = resolve(model)
        cfg_file = folder / "config.json"
        if not cfg_file.is_file():
            raise ModelNotFound(f"Invalid repository ID or local directory specified: '{model}'.")
        return cls(folder, json.loads(cfg_file.read_text()), tensors(folder))

    # ---------------------------------------------------------------- architecture
    @property
    def text(self) -> dict[str, Any]:
        return self.config.get("text_config") or self.config

    def get(self, *keys: str, default: Any = None) -> Any:
        for k in keys:
            if self.text.get(k) is not None:
                return self.text[k]
        return default

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or ["LlamaForCausalLM"])[0]

    @property
    def layers(self) -> int:
        return int(self.get("num_hidden_layers", "n_layer"))

    @property
    def heads(self) -> int:
        return int(self.get("num_attention_heads"))

    @property
    def kv_heads(self) -> int:
        return int(self.get("num_key_value_heads", default=self.heads))

    @property
    def hidden(self) -> int:
        return int(self.get("hidden_size"))

    @property
    def head_dim(self) -> int:
        return int(self.get("head_dim", default=self.hidden // self.heads))

    @property
    def vocab(self) -> int:
        return int(self.get("vocab_size"))

    @property
    def intermediate(self) -> int:
        return int(self.get("intermediate_size", "moe_intermediate_size", default=4 * self.hidden))

    @property
    def mla(self) -> bool:
        return self.get("kv_lora_rank") is not None

    @property
    def sliding_window(self) -> int | None:
        if self.get("use_sliding_window") is False:
            return None
        w = self.get("sliding_window")
        return int(w) if w else None

    def layer_windows(self) -> list[int | None]:
        """Each layer's attention window (None: full attention), as vLLM's model code assigns them."""
        w = self.sliding_window
        types = self.get("layer_types")
        if types:
            return [w if t == "sliding_attention" else None for t in types][: self.layers]
        if w is None:
            return [None] * self.layers
        arch = self.architecture
        if arch.startswith("Gemma2") or arch.startswith("Cohere2"):
            return [w if i % 2 == 0 else None for i in range(self.layers)]  # even layers slide (gemma2.py)
        if arch.startswith("Gemma3"):
            pattern = int(self.get("sliding_window_pattern", default=6))
            return [None if (i + 1) % pattern == 0 else w for i in range(self.layers)]
        return [w] * self.layers

    @property
    def experts(self) -> int:
        return int(self.get("num_experts", "num_local_experts", "n_routed_experts", default=0) or 0)

    @property
    def experts_per_token(self) -> int:
        return int(self.get("num_experts_per_tok", "num_experts_per_token", default=0) or 0)

    @property
    def max_position(self) -> int:
        return int(self.get("max_position_embeddings", default=2048))

    @property
    def config_dtype(self) -> str:
        return str(self.config.get("torch_dtype") or self.config.get("dtype") or self.text.get("torch_dtype")
                   or "bfloat16")

    @property
    def quantization(self) -> dict[str, Any] | None:
        return self.config.get("quantization_config")

    def quant_format(self) -> str | None:
        """The checkpoint's weight format as vLLM's compressed-tensors schemes see it: fp8, int8, int4, nvfp4,
        nvfp4a16, mxfp4, mxfp4a16 (None: not quantized)."""
        q = self.quantization
        if not q:
            return None
        method = q.get("quant_method")
        if method in ("fp8", "mxfp4", "awq", "gptq"):
            return {"awq": "int4", "gptq": "int4"}.get(method, method)
        fmt = q.get("format", "")
        groups = q.get("config_groups") or {}
        g = next(iter(groups.values()), {}) if groups else {}
        w, a = g.get("weights") or {}, g.get("input_activations")
        if fmt == "nvfp4-pack-quantized":
            return "nvfp4" if a else "nvfp4a16"
        if fmt == "mxfp4-pack-quantized":
            return "mxfp4" if a else "mxfp4a16"
        if w.get("type") == "float" and w.get("num_bits") == 8:
            return "fp8"
        if w.get("type") == "int" and w.get("num_bits") == 8:
            return "int8" if a else "int8-weights"
        if w.get("type") == "int" and w.get("num_bits") == 4:
            return "int4"
        return fmt or method

    # ---------------------------------------------------------------- sizes
    def param_count(self) -> int:
        if self.tensors:
            return sum(math.prod(s) for _, s, _ in self.tensors.values())
        return self._param_count_from_config()

    def _param_count_from_config(self) -> int:
        h, L, v, inter = self.hidden, self.layers, self.vocab, self.intermediate
        attn = h * self.heads * self.head_dim + 2 * h * self.kv_heads * self.head_dim + self.heads * self.head_dim * h
        mlp = 3 * h * inter * max(1, self.experts)
        emb = v * h * (1 if self.text.get("tie_word_embeddings") else 2)
        return L * (attn + mlp + 2 * h) + emb + h

    def weight_bytes(self, dtype_bytes: int, quantization: str | None = None) -> int:
        """The bytes the weights take once loaded: the checkpoint's own tensor bytes, in the served dtype where they
        are floating point (``--dtype`` casts them); ``--quantization fp8`` stores 2-D linear weights in one byte."""
        if not self.tensors:
            return int(self._param_count_from_config() * dtype_bytes)
        total = 0
        for name, (dt, shape, nbytes) in self.tensors.items():
            floating = dt in ("F32", "F16", "BF16", "F64")
            if floating and self.quant_format() is None:
                per = dtype_bytes
                if quantization == "fp8" and len(shape) == 2 and "embed" not in name and "lm_head" not in name \
                        and "norm" not in name:
                    per = 1
                total += math.prod(shape) * per
            else:
                total += nbytes
        return int(total)

    def active_params(self) -> int:
        """Parameters one token computes with (MoE: the routed experts only)."""
        total = self.param_count()
        if self.experts and self.experts_per_token:
            expert = 3 * self.hidden * int(self.get("moe_intermediate_size", "intermediate_size"))
            total -= self.layers * expert * (self.experts - self.experts_per_token)
        return total


# -------------------------------------------------------------------------------------------- tokenizer
class Tokenizer:
    """The folder's tokenizer (the fast ``tokenizer.json``) and its chat template, as vLLM applies them."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as _T

        tj = folder / "tokenizer.json"
        if not tj.is_file():
            raise ModelNotFound(f"{folder} holds no tokenizer.json")
        self.tok = _T.from_file(str(tj))
        tc = folder / "tokenizer_config.json"
        self.config = json.loads(tc.read_text()) if tc.is_file() else {}
        tmpl = folder / "chat_template.jinja"
        self.chat_template = tmpl.read_text() if tmpl.is_file() else self.config.get("chat_template")
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.eos_token = self._token_text(self.config.get("eos_token"))
        self.bos_token = self._token_text(self.config.get("bos_token"))
        self.eos_id = self.tok.token_to_id(self.eos_token) if self.eos_token else None
        special = {self.tok.token_to_id(t) for t in self._specials()}
        word = re.compile(r"^(Ġ|▁)?[A-Za-z]{2,10}$")
        self.words = [i for t, i in self.tok.get_vocab().items() if word.match(t) and i not in special]
        self.words.sort()

    @staticmethod
    def _token_text(t: Any) -> str | None:
        return t.get("content") if isinstance(t, dict) else t

    def _specials(self) -> list[str]:
        out = [d.get("content") for d in (self.config.get("added_tokens_decoder") or {}).values()]
        return [t for t in out if t]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, i: int) -> str:
        return self.tok.decode([i], skip_special_tokens=False)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **kwargs: Any) -> str:
        """The prompt vLLM renders for chat messages (the tokenizer's Jinja template, as transformers runs it)."""
        if not self.chat_template:
            raise ValueError("As of transformers v4.44, default chat template is no longer allowed, so you must "
                             "provide a chat template if the tokenizer does not define one.")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: __import__("time").strftime(fmt)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
            eos_token=self.eos_token or "", **kwargs)
