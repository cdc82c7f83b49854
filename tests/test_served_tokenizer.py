"""Workloads follow the served model's tokenizer: a second tokenizer, trained here on the repo's own text, behind a
calibration server that counts prompt tokens with it. Built for the server, every prompt is exactly the length asked
for as that server counts it; built with SmolLM2's tokenizer instead, the same spec misses on that server."""

import json

import pytest

from helpers import bench, models, settings


@pytest.fixture(scope="module")
def second_tokenizer(tmp_path_factory):
    """A 2,000-token BPE vocabulary trained on the repo's own text (nothing downloaded), saved as a transformers
    folder."""
    from tokenizers import Tokenizer, models as tm, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = settings.data_dir()
    text = [m["content"] for line in (root / "prompts" / "sample_chat.jsonl").read_text().splitlines()
            for m in json.loads(line)["messages"]]
    text += [p.read_text() for p in sorted(root.parent.glob("*.md")) + sorted(root.rglob("*.md"))]
    tok = Tokenizer(tm.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.train_from_iterator(text * 2, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder = tmp_path_factory.mktemp("second-tokenizer")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    fast.save_pretrained(folder)
    return folder


def test_workloads_are_built_with_the_served_tokenizer(second_tokenizer):
    spec = bench.FixedLength(input_len=60, output_len=4, endpoint="completions")
    with bench.CalibrationServer(ttft_s=0.005, tpot_s=0.001, tokenizer=str(second_tokenizer)) as cal:
        served = bench.run(spec, bench.Concurrent(4), base_url=cal, num_requests=8, seed=1, out=False)
        wrong = bench.run(bench.FixedLength(input_len=60, output_len=4, endpoint="completions",
                                            tokenizer=models.DEFAULT_ID),
                          bench.Concurrent(4), base_url=cal, num_requests=8, seed=1, out=False)
    assert served.config["workload"]["tokenizer"] == str(second_tokenizer)
    assert served.summary.input_tokens["mismatched"] == 0 and served.summary.completed == 8
    assert all(r.input_tokens == 60 for r in served.records)
    # The same spec counted with SmolLM2's tokenizer is not 60 tokens on this server.
    assert wrong.summary.input_tokens["mismatched"] == 8
    assert any("input tokens" in w for w in wrong.summary.warnings)


def test_the_two_tokenizers_really_differ(second_tokenizer):
    a = bench.token_counter(str(second_tokenizer))
    b = bench.token_counter(models.DEFAULT_ID)
    text = "Explain how the key value cache grows with the length of a conversation."
    assert a.completion(text) != b.completion(text)
