"""Quantized checkpoints served by real vLLM on CPU: W8A8 INT8 and W4A16 GPTQ (group 64) each start and answer a
greedy completion; the log names the linear kernel vLLM picked. A fake-quantized bf16 checkpoint loads into the
session's running server in place (`Server.swap_weights`, as labs 12-15 serve them) and back.

Two server starts (about 40-50 s each here) plus, on a cold cache, the W4A16 GPTQ build of three decoder layers (about
a minute; the real-server tests run beside tests/test_quant_build.py, which builds the same one: the second to ask
waits on the cache's lock and finds it).
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from helpers import evals, quant, runtime, server

TEST_SAMPLES = 16  # as tests/test_quant_build.py: the same cached GPTQ checkpoint


def _has_quant_env() -> bool:
    try:
        quant.quant_python()
        return True
    except quant.QuantEnvMissing:
        return False


pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM installed"),
    pytest.mark.skipif(not _has_quant_env(), reason="needs .venv-quant (make setup)"),
]

_KERNEL = re.compile(r"(?:Selected|Using) (\w+Kernel) for (\w+)")  # "Selected CPUInt8ScaledMMLinearKernel for ..."
_QUANT = re.compile(r"\bquantization=([\w-]+)")     # the engine config line


def _start(prof: runtime.Profile, path: str, **kw) -> server.Server:
    # other labs' servers on this machine: wait up to 10 minutes for a slot
    return server.start(quant.serving_profile(prof, path), max_model_len=1024, reuse=False, progress=False,
                        wait_for_slot_s=600, **kw)


def _kernel_lines(log: str) -> list[str]:
    return [ln.strip() for ln in log.splitlines() if _KERNEL.search(ln)]


@pytest.mark.parametrize("which,method,kernel", [
    ("w8a8-rtn", "compressed-tensors", "CPUInt8ScaledMMLinearKernel"),
    ("w4a16-gptq-g64", "compressed-tensors", "CPUWNA16LinearKernel"),
])
def test_quantized_checkpoint_serves_on_cpu(which, method, kernel, record_property):
    refused = None
    # W4A16 on decoder layers 0-2 (quant.first_layers), the checkpoint tests/test_quant_build.py and lab 14 build:
    # the same kernel path as the whole model's, built once (about a minute; all 30 layers took 5 here).
    r = quant.first_layers(which, 3) if which.startswith("w4a16") else quant.recipe(which)
    ckpt = quant.build("default", r, samples=TEST_SAMPLES)
    try:
        quant.check_servable(ckpt.path)
    except quant.UnservableError as e:  # INT4 on a CPU without AVX-512: check the refusal is still true
        refused = e
    record_property("build_s", ckpt.seconds)
    srv = _start(runtime.profile("cpu"), str(ckpt.path))
    try:
        if refused is not None:
            with pytest.raises(Exception):
                srv.client(max_retries=0).completions.create(model=srv.model, prompt="Hi", max_tokens=4,
                                                             timeout=120)
            assert "cpu_gemm_wna16" in srv.log_text(), "a new reason; update quant.check_servable"
            lines = _kernel_lines(srv.log_text())
            print(f"\n{which}: refused here ({refused}); vLLM confirms: " + "; ".join(lines))
            assert any(kernel in ln for ln in lines), lines
            return
        out = srv.client().completions.create(model=srv.model, prompt="The capital of France is", max_tokens=8,
                                              temperature=0)
        text = out.choices[0].text
        log = srv.log_text()
        lines = _kernel_lines(log)
        quantization = _QUANT.search(log)
        record_property("kernel_lines", lines)
        record_property("completion", text)
        print(f"\n{which}: ready in {srv.ready_s:.0f} s; completion {text!r}\n  " + "\n  ".join(lines))
    finally:
        srv.terminate()
    assert text.strip(), "an empty completion"
    assert quantization and quantization.group(1) == method, quantization
    assert any(kernel in ln for ln in lines), f"{kernel} not in the log's kernel lines: {lines}"


def test_fake_quantized_weights_swap_in_and_back(cpu_server):
    """The fake-NVFP4 copy loads into the running server in place: its weights move the next-token distributions
    and still answer, and swapping the original weights back gives exactly the freshly started server's: the
    in-place load is the same as a start, with no stale weights (a CPU kernel's packed copy, a tied head) left
    behind. A quantized checkpoint is refused: its layers differ."""
    srv = cpu_server
    ckpt = quant.fake_quantized_checkpoint("default", "nvfp4")
    texts = ["The capital of France is Paris, and the capital of Italy is Rome.",
             "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"]
    fresh = evals.prompt_logprobs(srv, texts)
    assert srv.swap_weights(ckpt.path) < 60 and srv.weights_path is not None
    fake = evals.prompt_logprobs(srv, texts)
    text = srv.client().completions.create(model=srv.model, prompt="The capital of France is", max_tokens=8,
                                           temperature=0).choices[0].text
    assert srv.swap_weights(srv.model_path) < 60 and srv.weights_path is None  # its own weights again: parkable
    again = evals.prompt_logprobs(srv, texts)
    assert again == fresh
    moved = evals.drift(fresh, fake)
    assert moved.kl_mean > 1e-3, moved
    assert text.strip(), "an empty completion from the fake-quantized weights"
    with pytest.raises(ValueError, match="quantized checkpoint"):
        srv.swap_weights(quant.build("default", quant.recipe("w8a8-rtn"), samples=TEST_SAMPLES).path)
