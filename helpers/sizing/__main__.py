"""``python -m helpers.sizing CONFIG --context N [--gpu h100 [--gpu-memory-utilization 0.9] [--batch B]] [--json]``
(installed as ``labs-sizing``)."""

from __future__ import annotations

import argparse
import json
import sys

from . import check_request, config_names, hardware, load_config, plan_sheet, summary, vllm_kv_capacity
from .hardware import HARDWARE


def _human(n: float) -> str:
    if n >= 2**30:
        return f"{n:,.0f} ({n / 2**30:,.2f} GiB)"
    if n >= 2**20:
        return f"{n:,.0f} ({n / 2**20:,.2f} MiB)"
    return f"{n:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="labs-sizing",
        description="Parameters, weight bytes and KV cache bytes of a model from its config.json.",
        epilog=f"shipped configs: {', '.join(config_names())}",
    )
    parser.add_argument("config", help="config.json, checkpoint folder, shipped name (e.g. llama-3.1-8b) or 'default'")
    parser.add_argument("--context", type=int, required=True, help="tokens in one sequence")
    parser.add_argument("--kv-dtype", default="auto", help="auto (model dtype), bf16, fp16, fp8, fp8_e4m3, fp8_e5m2")
    parser.add_argument("--weight-dtype", default="auto", help="auto, bf16, fp16, fp8, int8, int4, nvfp4, mxfp4")
    parser.add_argument("--group-size", type=int, default=128, help="int4 group size (columns per scale)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (KV bytes per rank)")
    parser.add_argument("--kv-cache-bytes", type=int, help="also report vLLM's capacity for this much KV memory")
    parser.add_argument("--block-size", type=int, help="vLLM block size (CPU 128, GPU 16) for --kv-cache-bytes")
    parser.add_argument("--max-model-len", type=int, help="max_model_len for the capacity (default: --context)")
    parser.add_argument("--gpu", help=f"a card to size it on, by catalog key ({', '.join(HARDWARE)}) or by its "
                        "nvidia-smi name: adds the what-if Sizing Sheet (KV room, concurrency, roofline times)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="with --gpu: vLLM's share of the card (default 0.9, as vLLM's)")
    parser.add_argument("--batch", type=int, default=1, help="with --gpu: requests decoding together")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        check_request(cfg, args.context, gpu_memory_utilization=args.gpu_memory_utilization, tp=args.tp,
                      batch=args.batch)
        if args.gpu:
            sheet = plan_sheet(cfg, hardware(args.gpu), args.context, args.batch, weight_dtype=args.weight_dtype,
                               kv_dtype=args.kv_dtype, gpu_memory_utilization=args.gpu_memory_utilization, tp=args.tp)
            print(sheet.to_json() if args.json else sheet.to_markdown(), end="" if args.json else "")
            return 0
        out = summary(cfg, args.context, args.kv_dtype, args.weight_dtype, tp=args.tp, group_size=args.group_size)
        if args.kv_cache_bytes is not None:
            if args.block_size is None:
                parser.error("--kv-cache-bytes needs --block-size (128 on CPU, 16 on most GPUs)")
            cap = vllm_kv_capacity(cfg, args.kv_cache_bytes, args.block_size, args.max_model_len or args.context,
                                   args.kv_dtype, args.tp)
            out.update(num_blocks=cap.num_blocks, kv_cache_tokens=cap.kv_cache_tokens,
                       max_concurrency=round(cap.max_concurrency, 4),
                       vllm_log_line=cap.log_line("CPU" if args.block_size == 128 else "GPU"))
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(cfg.describe())
    width = max(len(k) for k in out)
    for key, value in out.items():
        if key == "model":
            continue
        shown = _human(value) if isinstance(value, int) and "bytes" in key else (
            f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value))
        print(f"  {key:<{width}}  {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
