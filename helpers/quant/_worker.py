"""Run one llm-compressor recipe on one model and save a compressed-tensors checkpoint (runs in ``.venv-quant``).

``python path/to/_worker.py JOB.json`` — the job names the model folder, the output folder, the recipe (as
:class:`helpers.quant.recipes.Recipe` writes it), the calibration file and how many samples of how many tokens.
This file imports only the standard library, torch, transformers, datasets and llmcompressor: it runs in the
quantization environment, which has no vLLM and no ``helpers``. It prints one line ``LABS_RESULT {json}`` at
the end; :func:`helpers.quant.build.build` reads it from the log.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def calibration_ids(tokenizer, path: str, samples: int, seq_len: int) -> list[list[int]]:
    """Pack the calibration texts, in file order, into ``samples`` rows of exactly ``seq_len`` tokens."""
    texts = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text + "\n\n", add_special_tokens=False)["input_ids"]
    need = samples * seq_len
    if len(stream) < need:
        raise SystemExit(f"the calibration file {path} holds {len(stream):,} tokens, fewer than samples x seq_len = "
                         f"{samples} x {seq_len} = {need:,}: ask for fewer samples or shorter ones")
    return [stream[i * seq_len:(i + 1) * seq_len] for i in range(samples)]


def _scheme(recipe: dict) -> dict:
    """The compressed-tensors preset, with the recipe's group size; as a config group for the modifier."""
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme(recipe["scheme"], list(recipe["targets"]))
    if recipe.get("group_size") and scheme.weights is not None and scheme.weights.group_size is not None:
        scheme.weights.group_size = int(recipe["group_size"])
    return {"group_0": scheme}


def modifiers(recipe: dict) -> list:
    """The llm-compressor modifiers for a recipe: [SmoothQuant] [AWQ] then GPTQ or plain round-to-nearest."""
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    common = {"config_groups": _scheme(recipe), "ignore": list(recipe["ignore"])}
    mods: list = []
    if recipe.get("smoothquant"):
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

        mods.append(SmoothQuantModifier(smoothing_strength=float(recipe["smoothquant"])))
    algorithm = recipe["algorithm"]
    if algorithm == "awq":
        from llmcompressor.modifiers.transform.awq import AWQModifier

        mods.append(AWQModifier(duo_scaling=True))
        mods.append(QuantizationModifier(**common))
    elif algorithm == "gptq":
        mods.append(GPTQModifier(actorder=recipe.get("actorder"), dampening_frac=float(recipe["dampening_frac"]),
                                 **common))
    elif algorithm == "rtn":
        mods.append(QuantizationModifier(**common))
    else:
        raise SystemExit(f"unknown algorithm {algorithm!r}")
    return mods


def restore_dtype(model, dtype) -> None:
    """Back to the checkpoint's dtype after float32 calibration: float32 weights and scales become ``dtype``
    (int codes do not change: a bf16 scale moves a code by at most 127 x 2**-9 < 0.5); NVFP4's global scales,
    which compressed-tensors keeps in float32, and FP8/uint8 scales stay as they are."""
    import torch

    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p.dtype == torch.float32 and not name.endswith("global_scale"):
            p.data = p.data.to(dtype)
    model.config.dtype = dtype


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    from llmcompressor import oneshot

    recipe = job["recipe"]
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype="auto")
    source_dtype = model.dtype
    if job.get("calibration") and not torch.cuda.is_available():
        # Forward passes on CPU: float32, not bf16 (a CPU without AMX/AVX512-BF16 emulates bf16 matmuls; measured
        # here 179 ms vs 40 ms for 256 x 576 x 1536). Data-free recipes never run the model and stay in bf16; on a GPU
        # (llm-compressor calibrates there by itself) the model keeps its dtype.
        model = model.float()
    t_load = time.perf_counter()
    kwargs: dict = {}
    if job.get("calibration"):
        from datasets import Dataset

        rows = calibration_ids(tokenizer, job["calibration"], int(job["samples"]), int(job["seq_len"]))
        kwargs = {"dataset": Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]}),
                  "num_calibration_samples": len(rows), "max_seq_length": int(job["seq_len"]),
                  "shuffle_calibration_samples": False}
        if recipe.get("pipeline"):
            kwargs["pipeline"] = recipe["pipeline"]
    else:
        kwargs = {"pipeline": "datafree"}
    model = oneshot(model=model, recipe=modifiers(recipe), **kwargs)
    if model.dtype != source_dtype:
        restore_dtype(model, source_dtype)
    t_quant = time.perf_counter()
    out = Path(job["out"])
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    result = {"load_s": round(t_load - t0, 2), "quantize_s": round(t_quant - t_load, 2),
              "save_s": round(time.perf_counter() - t_quant, 2), "torch": torch.__version__}
    print("LABS_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python _worker.py JOB.json")
    sys.exit(main(sys.argv[1]))
