"""Labs 20-21's KV-connector arithmetic: which tokens ExampleConnector saves and loads (against vLLM's own
alignment function), what a store holds on disk, and a tier's expected TTFT and break-even hit rate."""

import pytest

from helpers.fleet import kvstore


def test_saved_and_loaded_tokens_follow_vllms_alignment():
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import align_to_block_size

    for block in (16, 128):
        for n in (1, 2, 17, 128, 129, 130, 1000, 1024, 1025):
            assert kvstore.stored_tokens(n, block) == max(0, align_to_block_size(n, block))
            assert kvstore.injected_tokens(n, block) == max(0, align_to_block_size(n - 1, block))
    assert kvstore.injected_tokens(1000, 128) == 896  # measured: "Inject KV cache of 896 tokens"
    assert kvstore.injected_tokens(129, 128) == 0      # the last block is never handed over whole


def test_connector_config_and_store_usage(tmp_path):
    cfg = kvstore.example_connector("kv_both", tmp_path / "store")
    assert cfg["kv_connector"] == "ExampleConnector" and cfg["kv_role"] == "kv_both"
    assert cfg["kv_connector_extra_config"]["shared_storage_path"] == str((tmp_path / "store").resolve())
    with pytest.raises(ValueError, match="kv_producer"):
        kvstore.example_connector("producer", tmp_path)
    assert kvstore.usage(tmp_path / "missing") == {"prompts": 0, "files": 0, "bytes": 0}
    for prompt in ("a", "b"):
        for layer in range(3):
            (tmp_path / "store" / prompt).mkdir(parents=True, exist_ok=True)
            (tmp_path / "store" / prompt / f"model.layers.{layer}.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "store" / "stray.txt").write_text("not a prompt")
    assert kvstore.usage(tmp_path / "store") == {"prompts": 2, "files": 6, "bytes": 60}
    assert kvstore.empty(tmp_path / "store") == {"prompts": 2, "files": 6, "bytes": 60}   # what it held
    assert kvstore.usage(tmp_path / "store") == {"prompts": 0, "files": 0, "bytes": 0}
    assert (tmp_path / "store").is_dir()   # the servers' shared_storage_path stays
    assert kvstore.empty(tmp_path / "missing") == {"prompts": 0, "files": 0, "bytes": 0}


def test_tiered_ttft_and_break_even_agree():
    load, recompute, overhead = 0.1, 0.5, 0.05
    h = kvstore.break_even_hit_rate(load, recompute, overhead)
    assert h == pytest.approx(0.05 / 0.45)
    # at the break-even hit rate the tier's expected TTFT equals recomputing every time
    assert kvstore.tiered_ttft(h, load, recompute, overhead) == pytest.approx(recompute)
    assert kvstore.tiered_ttft(h + 0.1, load, recompute, overhead) < recompute
    assert kvstore.break_even_hit_rate(0.1, 0.5) == 0.0
    assert kvstore.break_even_hit_rate(0.6, 0.5) is None
    with pytest.raises(ValueError):
        kvstore.tiered_ttft(1.5, load, recompute)
