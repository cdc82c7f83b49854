"""The quantization environment's interpreter on a rehearsal's machine: ``.venv-quant/bin/python`` as the labs call it.

``helpers.quant`` and ``helpers.evals`` run three things there, and this stands in for each:

- ``python _worker.py JOB.json`` (llm-compressor's ``oneshot``): writes the compressed-tensors checkpoint the recipe
  makes of the model, with llm-compressor 0.14.0.1's config and tensor layout (``compressed_tensors.json``, recorded
  from real builds) over sparse data, in seconds instead of an 8B model's minutes;
- lm-eval (``-c`` with the project's task-index patch, or ``-m lm_eval``): asks the server for each choice's
  log-likelihood (``echo`` with ``logprobs``, as ``local-completions`` does) and writes lm-eval's per-question samples;
  a built-in task (ARC) gets questions of its own shape, since its data set cannot be downloaded here;
- ``-c`` probes (``find_spec``, versions): answered as the real environment would.

The environment's folder carries the dist-info names ``helpers.quant.env`` reads (llmcompressor 0.14.0.1, a CUDA torch,
lm_eval 0.4.13). Nothing it writes is a number a learner sees.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}
KNOWN_MODULES = {"llmcompressor", "lm_eval", "compressed_tensors", "torch", "transformers", "datasets"}


# ------------------------------------------------------------------------------------------------ builds
def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]],
                 values: dict[str, bytes] | None = None) -> int:
    """A safetensors file over holes, but for ``values`` (small tensors whose bytes matter: ``weight_shape``)."""
    header, off = {}, 0
    for name, (dt, shape) in tensors.items():
        n = _BYTES[dt] * math.prod(shape)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, data in (values or {}).items():
            if name in header:
                fh.seek(8 + len(raw) + header[name]["data_offsets"][0])
                fh.write(data)
        fh.truncate(8 + len(raw) + off)
    return 8 + len(raw) + off


def _source_tensors(folder: Path) -> dict[str, tuple[str, list[int]]]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            h = json.loads(fh.read(n))
        out.update({k: (v["dtype"], v["shape"]) for k, v in h.items() if k != "__metadata__"})
    return out


def _ignored(name: str, ignore: list[str]) -> bool:
    import re

    module = name.rsplit(".", 1)[0]
    for pat in ignore:
        if pat.startswith("re:") and re.match(pat[3:], module):
            return True
        if module == pat or module.endswith("." + pat) or module.split(".")[-1] == pat:
            return True
    return False


def build(job: dict) -> dict:
    recipe = job["recipe"]
    table = json.loads((HERE / "compressed_tensors.json").read_text())["schemes"]
    scheme = table[recipe["scheme"]]
    src, out = Path(job["model"]), Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    qc = json.loads(json.dumps(scheme["quantization_config"]))
    qc["ignore"] = list(recipe.get("ignore") or ["lm_head"])
    g = qc["config_groups"]["group_0"]
    g["targets"] = list(recipe.get("targets") or ["Linear"])
    if recipe.get("group_size") and g["weights"].get("strategy") == "group":
        g["weights"]["group_size"] = int(recipe["group_size"])
    if recipe.get("algorithm") == "gptq":
        g["weights"]["actorder"] = recipe.get("actorder")
    cfg["quantization_config"] = qc
    group = int(g["weights"].get("group_size") or 0)
    tensors: dict[str, tuple[str, list[int]]] = {}
    values: dict[str, bytes] = {}
    for name, (dt, shape) in _source_tensors(src).items():
        linear = name.endswith(".weight") and len(shape) == 2 and "embed" not in name and "norm" not in name
        if not linear or _ignored(name, qc["ignore"]):
            tensors[name] = (dt, shape)
            continue
        base = name[: -len("weight")]
        o, i = shape
        for suffix, rule in scheme["linear"].items():
            if "shape" in rule:
                tensors[base + suffix] = (rule["dtype"], list(rule["shape"]))
                if suffix == "weight_shape":  # the unpacked shape, as llm-compressor stores it
                    values[base + suffix] = struct.pack("<2q", o, i)
                continue
            in_ratio = rule.get("in_ratio")
            if in_ratio == 64.0 and group:  # the recorded build used group 64: the recipe's own group size
                in_ratio = group
            d0 = rule.get("out_fixed") or int(o // rule["out_ratio"])
            d1 = rule.get("in_fixed") or int(i // in_ratio)
            tensors[base + suffix] = (rule["dtype"], [d0, d1])
    per_shard, shards, cur, size = 5 * 10**9, [], {}, 0
    modules: dict[str, dict[str, tuple[str, list[int]]]] = {}
    for name, meta in tensors.items():  # a module's tensors stay in one shard, as save_pretrained leaves them
        modules.setdefault(name.rsplit(".", 1)[0], {})[name] = meta
    for group in modules.values():
        n = sum(_BYTES.get(dt, 2) * math.prod(shape) for dt, shape in group.values())
        if cur and size + n > per_shard:
            shards.append(cur)
            cur, size = {}, 0
        cur.update(group)
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards, start=1):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        total += _safetensors(out / fname, shard, {k: v for k, v in values.items() if k in shard})
        weight_map.update({t: fname for t in shard})
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                      "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
              "special_tokens_map.json"):
        if (src / f).is_file():
            (out / f).write_bytes((src / f).read_bytes())
    (out / "recipe.yaml").write_text(f"# rehearsal stand-in for llm-compressor's recipe: {recipe.get('name')}\n")
    return {"load_s": 0.1, "quantize_s": 0.1, "save_s": 0.1, "torch": "2.13.0+cu130", "standin": True}


# ------------------------------------------------------------------------------------------------ lm-eval
def _arg(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


_CLIENT = None


def _loglikelihood(base_url: str, model: str, context: str, continuation: str, key: str | None) -> float:
    global _CLIENT
    import httpx

    _CLIENT = _CLIENT or httpx.Client()  # one client: httpx.post builds a TLS context per call (~23 ms of CPU)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = _CLIENT.post(base_url, json={"model": model, "prompt": context + continuation, "max_tokens": 1, "echo": True,
                                   "logprobs": 1, "temperature": 0}, headers=headers, timeout=600)
    r.raise_for_status()
    lp = r.json()["choices"][0]["logprobs"]
    offsets, values = lp["text_offset"], lp["token_logprobs"]
    start = len(context)
    return sum(v for o, v in zip(offsets, values) if v is not None and o >= min(start, len(offsets) - 2))


def lm_eval(argv: list[str]) -> int:
    model_args = dict(kv.split("=", 1) for kv in (_arg(argv, "--model_args") or "").split(",") if "=" in kv)
    tasks = (_arg(argv, "--tasks") or "").split(",")
    limit = _arg(argv, "--limit")
    out = Path(_arg(argv, "--output_path") or ".")
    include = _arg(argv, "--include_path")
    key = os.environ.get("OPENAI_API_KEY")
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
    folder = out / model_args.get("model", "model").replace("/", "__")
    folder.mkdir(parents=True, exist_ok=True)
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, int(model_args.get("num_concurrent", 1)))
    for task in tasks:
        docs = _docs(task, include, int(limit) if limit else None)
        rows = []
        asks = [(doc["question"], c) for doc in docs for c in doc["choices"]]
        with ThreadPoolExecutor(workers) as pool:  # num_concurrent requests in flight, as lm-eval sends them
            scored = list(pool.map(lambda a: _loglikelihood(model_args["base_url"], model_args["model"], a[0], a[1],
                                                            key), asks))
        at = 0
        for n, doc in enumerate(docs):
            lls = scored[at:at + len(doc["choices"])]
            at += len(doc["choices"])
            best = max(range(len(lls)), key=lls.__getitem__)
            rows.append({"doc_id": n, "doc": doc, "target": doc["answer"], "acc": float(best == doc["answer"]),
                         "acc_norm": float(best == doc["answer"]), "filtered_resps": [[x, False] for x in lls]})
        with open(folder / f"samples_{task}_{stamp}.jsonl", "w") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
    print(f"local-completions (stand-in for lm-eval 0.4.13), tasks {tasks}: done")
    return 0


def _docs(task: str, include: str | None, limit: int | None) -> list[dict]:
    if include:
        yaml = Path(include) / f"{task}.yaml"
        if yaml.is_file():
            text = yaml.read_text()
            data = text.split("test: ", 1)[1].split("\n", 1)[0].strip()
            docs = [json.loads(x) for x in Path(data).read_text().splitlines() if x.strip()]
            return docs[:limit] if limit else docs
    # a built-in task (ARC-Challenge): its data set is on the hub; questions of its shape stand in for it
    n = limit or 20
    return [{"id": f"{task}-{k}", "question": f"Question {k}: which of these is the answer?\nAnswer:",
             "choices": [f" option {c}" for c in "ABCD"], "answer": k % 4} for k in range(n)]


# ------------------------------------------------------------------------------------------------ the interpreter
def main(argv: list[str]) -> int:
    if not argv:
        print("stand-in for the quantization environment's python: no interactive mode", file=sys.stderr)
        return 2
    if argv[0].endswith("_worker.py"):
        job = json.loads(Path(argv[1]).read_text())
        result = build(job)
        print("LABS_RESULT " + json.dumps(result), flush=True)
        return 0
    if argv[:2] == ["-m", "lm_eval"]:
        return lm_eval(argv[2:])
    if argv[0] == "-c":
        code = argv[1]
        if "cli_evaluate" in code:
            return lm_eval(argv[2:])
        if "find_spec" in code:
            mod = code.split("find_spec(")[1].split(")")[0].strip("'\"")
            return 0 if mod.split(".")[0] in KNOWN_MODULES else 1
        if "llmcompressor" in code and "version" in code:
            print("0.14.0.1")
            return 0
        if "torch" in code:
            print("2.13.0+cu130 13.0")
            return 0
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
        return 0
    print(f"stand-in quantization python: not a call the labs make: {argv[:3]}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
