"""The calibration text: the token table the plans trust is what the files hold, and builds read enough of it."""

import json

import pytest

from helpers import calibration, models, plan, quant, runtime


def test_the_token_table_is_what_the_files_hold_today():
    """tokens.json is recounted: each file's hash, its pre-tokenizer chunks, and SmolLM2's own tokenizer's count."""
    assert calibration.measure() == calibration.recorded()


def test_the_lower_bound_is_below_a_real_tokenizers_count():
    """The bound the GPU profiles rely on never exceeds what a byte-level BPE tokenizer makes (SmolLM2's here)."""
    for name, row in calibration.recorded()["files"].items():
        assert row["pretoken_chunks"] <= row["tokens"][models.DEFAULT_ID], name


@pytest.mark.parametrize("name", sorted(runtime.PROFILES))
def test_every_profile_has_the_calibration_text_its_labs_ask_for(name):
    """Lab 14 asked a GPU profile for 128 x 256 = 32,768 tokens where the shipped text held 19,331 (SmolLM2's
    count; fewer with Llama's or Qwen's): the worker exited on the shortfall. Every lab's plan now says both."""
    for number in ("14", "15", "17"):
        for quick in (False, True):
            cal = plan.lab(number, name, quick=quick).calibration
            if cal is None:
                continue
            assert cal["tokens_available"] >= cal["tokens_needed"], (number, name, cal)
    cal14 = plan.lab("14", name, quick=False).calibration
    assert cal14["tokens_needed"] == cal14["samples"] * cal14["seq_len"]


def test_a_build_reads_the_first_file_alone_when_it_holds_enough(tmp_path, monkeypatch):
    """The CPU profile's builds keep reading mixed.jsonl alone (their cache keys unchanged); more tokens than it holds
    read both files, joined once into the cache."""
    monkeypatch.setenv("LABS_CACHE", str(tmp_path))
    assert quant.default_calibration("default", 16 * 256).name == "mixed.jsonl"
    joined = quant.default_calibration(runtime.LLAMA_8B, 128 * 256)
    assert joined.parent == tmp_path / "calibration"
    lines = joined.read_text().splitlines()
    first = [json.loads(x)["text"] for x in (calibration._dir() / "mixed.jsonl").read_text().splitlines()]
    assert [json.loads(x)["text"] for x in lines[:len(first)]] == first and len(lines) > len(first)
    assert quant.default_calibration(runtime.LLAMA_8B, 128 * 256) == joined  # written once


def test_a_build_that_needs_more_text_than_shipped_is_refused_before_any_work():
    with pytest.raises(ValueError, match="fewer samples"):
        quant.build("default", "w4a16-gptq-g64", samples=4096, seq_len=256)
