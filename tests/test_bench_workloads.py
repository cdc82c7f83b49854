"""Workloads: exact token counts with the embedded model's tokenizer, shared prefixes, disjoint warmup, JSONL."""

from __future__ import annotations

import json

import pytest

from helpers.bench import SAMPLE_CHAT, FixedLength, FromJsonl, SharedPrefix, token_counter


@pytest.fixture(scope="module")
def tc():
    return token_counter()  # the embedded SmolLM2 tokenizer, loaded once


@pytest.mark.parametrize("n", [1, 7, 128, 700])
def test_completion_prompts_are_exact_to_the_token(tc, n):
    wl = FixedLength(input_len=n, output_len=5, endpoint="completions").build(6, seed=n)
    for r in wl.requests:
        assert tc.completion(r.prompt) == n == r.expected_input_tokens
        assert r.max_output_tokens == r.min_output_tokens == 5
    assert len({r.prompt for r in wl.requests}) == 6


def test_chat_expected_tokens_include_the_template(tc):
    wl = FixedLength(input_len=100, output_len=8, endpoint="chat").build(5, seed=1)
    for r in wl.requests:
        (msg,) = r.messages
        assert tc.content(msg["content"]) == 100
        assert r.expected_input_tokens == tc.chat(r.messages) > 100
        assert r.meta["template_tokens"] == r.expected_input_tokens - 100
    # SmolLM2's template adds its default system prompt and the role markers: ~30 tokens
    assert 10 < wl.requests[0].meta["template_tokens"] < 60


def test_seeded_and_reproducible(tc):
    a = FixedLength(input_len=50, output_len=4, endpoint="completions").build(3, seed=5, warmup=2)
    b = FixedLength(input_len=50, output_len=4, endpoint="completions").build(3, seed=5, warmup=2)
    c = FixedLength(input_len=50, output_len=4, endpoint="completions").build(3, seed=6)
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert [r.prompt for r in a.requests] != [r.prompt for r in c.requests]


def _first_tokens(tc, wl, k=16):
    def ids(r):
        return tuple(tc.ids(r.prompt)[:k]) if r.prompt is not None else tuple(tc.ids(tc.render_chat(r.messages),
                                                                                      special=False)[:k])
    return {ids(r) for r in wl.requests}, {ids(r) for r in wl.warmup}


def test_warmup_prompts_never_share_a_prefix_with_measured_ones(tc):
    wl = FixedLength(input_len=200, output_len=4, endpoint="completions").build(20, seed=0, warmup=4)
    assert len(wl.warmup) == 4 and all(r.warmup for r in wl.warmup)
    measured, warm = _first_tokens(tc, wl, k=4)
    assert not measured & warm
    for w in wl.warmup:
        assert w.prompt.startswith("Warmup only")
        assert tc.completion(w.prompt) == 200


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_shared_prefix(tc, endpoint):
    spec = SharedPrefix(prefix_len=300, suffix_len=20, output_len=4, endpoint=endpoint, num_prefixes=2)
    wl = spec.build(6, seed=0, warmup=2)
    by_prefix = {}
    for r in wl.requests:
        by_prefix.setdefault(r.meta["prefix_id"], []).append(r)
    assert sorted(by_prefix) == [0, 1]
    if endpoint == "completions":
        for r in wl.requests:
            assert tc.completion(r.prompt) == 320 == r.expected_input_tokens
            assert r.meta["prefix_intact"]  # the prefix's tokens start every prompt, token for token
        a, b = by_prefix[0][:2]
        assert tc.ids(a.prompt)[:300] == tc.ids(b.prompt)[:300]
        assert tc.ids(a.prompt)[300:] != tc.ids(b.prompt)[300:]
        warm = wl.warmup[0]
        assert tc.ids(warm.prompt)[:8] != tc.ids(a.prompt)[:8]
    else:
        a, b = by_prefix[0][:2]
        assert a.messages[0] == b.messages[0] and a.messages[0]["role"] == "system"
        assert tc.content(a.messages[0]["content"]) == 300 and tc.content(a.messages[1]["content"]) == 20
        assert a.expected_input_tokens == tc.chat(a.messages)
        assert wl.warmup[0].messages[0] != a.messages[0]  # warmup has its own system prompt


def test_sample_chat_file_and_jsonl_formats(tc, tmp_path):
    rows = [json.loads(x) for x in SAMPLE_CHAT.read_text().splitlines()]
    assert 40 <= len(rows) <= 80 and all("messages" in r for r in rows)
    wl = FromJsonl(SAMPLE_CHAT).build(10, warmup=1)
    assert len(wl.requests) == 10 and wl.endpoint == "chat"
    assert wl.requests[0].expected_input_tokens == tc.chat(wl.requests[0].messages)
    assert wl.warmup[0].messages[0]["content"].startswith("Warmup only")  # synthetic, never from the file

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Hello there", "output_len": 7}\n\n{"prompt": "Bye"}\n')
    wl = FromJsonl(f, endpoint="completions").build(2)
    assert wl.requests[0].expected_input_tokens == tc.completion("Hello there")
    assert (wl.requests[0].min_output_tokens, wl.requests[1].min_output_tokens) == (7, None)
    assert FromJsonl(f, endpoint="chat", tokenizer=False).build(1).requests[0].messages[0]["content"] == "Hello there"
    with pytest.warns(UserWarning, match="prefix cache"):
        FromJsonl(f, endpoint="completions", tokenizer=False).build(3)
    with pytest.raises(ValueError, match="use endpoint='chat'"):
        FromJsonl(SAMPLE_CHAT, endpoint="completions").build(1)
