"""Workloads: exact token counts with the embedded model's tokenizer, shared prefixes, disjoint warmup, JSONL,
length distributions, multi-turn conversations and traces."""

from __future__ import annotations

import json

import pytest

from helpers.bench import (EXAMPLE_TRACE, SAMPLE_CHAT, Conversations, FixedLength, FromJsonl, Histogram, Normal,
                           SharedPrefix, Trace, TraceArrivals, Uniform, VariableLength, parse_length, token_counter)
from helpers.bench.conversations import read_conversations


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


# -------------------------------------------------------------------------- lengths that vary, each exact
def test_variable_lengths_are_drawn_seeded_and_each_request_is_exact(tc):
    spec = VariableLength(input_len=Uniform(8, 64), output_len=Normal(20, 8, low=4, high=40), endpoint="completions")
    wl = spec.build(12, seed=3, warmup=2)
    ins = [r.expected_input_tokens for r in wl.requests]
    outs = [r.max_output_tokens for r in wl.requests]
    assert all(8 <= a <= 64 for a in ins) and len(set(ins)) > 3 and all(4 <= b <= 40 for b in outs)
    for r in wl.requests:
        assert tc.completion(r.prompt) == r.expected_input_tokens == r.meta["input_len"]
        assert r.min_output_tokens == r.max_output_tokens == r.meta["output_len"]  # fixed, so checkable
    again = VariableLength(input_len=Uniform(8, 64), output_len=Normal(20, 8, low=4, high=40),
                           endpoint="completions").build(12, seed=3)
    assert [r.prompt for r in again.requests] == [r.prompt for r in wl.requests]
    assert len(wl.warmup) == 2 and all(w.prompt.startswith("Warmup only") for w in wl.warmup)
    hist = VariableLength(input_len=Histogram((10, 20, 30), (0, 1)), output_len=8, endpoint="chat").build(4, seed=1)
    for r in hist.requests:
        assert 20 <= r.meta["input_len"] < 30 and tc.content(r.messages[0]["content"]) == r.meta["input_len"]
    assert spec.cli_args() == ["--endpoint", "completions", "--input-len", "uniform:8:64",
                               "--output-len", "normal:20:8:4:40"]


def test_lengths_parse_from_the_command_line_and_say_what_is_wrong():
    assert parse_length("128") == 128
    assert parse_length("uniform:64:512") == Uniform(64, 512)
    assert parse_length("normal:256:64") == Normal(256, 64)
    assert parse_length("hist:16,64,256:3,1") == Histogram((16, 64, 256), (3.0, 1.0))
    assert Histogram.of([5, 6, 7, 50], bins=2).edges == (5, 28, 51)
    with pytest.raises(ValueError, match="uniform:LOW:HIGH"):
        parse_length("gaussian:3")
    with pytest.raises(ValueError, match="one more edge"):
        parse_length("hist:1,2:1,1")
    with pytest.raises(ValueError, match="low <= high"):
        Uniform(10, 5)


# ------------------------------------------------------------------------------- conversations, traces
def test_conversations_replay_turn_by_turn_with_the_previous_turns(tc):
    chats = read_conversations()
    assert 40 <= len(chats) <= 80 and all(len(c["turns"]) >= 2 for c in chats)
    wl = Conversations(output_len=12).build(40, seed=2, warmup=1)
    assert len(wl.requests) == 40 and wl.endpoint == "chat" and len(wl.warmup) == 1
    turns = [r.meta["turn"] for r in wl.requests]
    assert turns == sorted(turns)  # every conversation's first turn, then every second turn, ...
    by_conv = {}
    for r in wl.requests:
        by_conv.setdefault(r.meta["conversation"], []).append(r)
    followed = 0
    for reqs in by_conv.values():
        for prev, now in zip(reqs, reqs[1:]):
            assert now.messages[:len(prev.messages)] == prev.messages  # carries the turns before it
            assert now.messages[len(prev.messages)]["role"] == "assistant"
            prev_ids = tc.ids(tc.render_chat(prev.messages), special=False)
            assert now.meta["prefix_tokens"] == len(prev_ids)  # the whole previous prompt is a token prefix
            followed += 1
        assert reqs[0].meta["prefix_tokens"] == 0
        for r in reqs:
            assert r.expected_input_tokens == tc.chat(r.messages) and r.min_output_tokens == 12
    assert followed >= 10
    assert Conversations(output_len=12).build(40, seed=2).requests[5].messages == wl.requests[5].messages


def test_a_trace_brings_its_lengths_and_its_arrival_times(tc, tmp_path):
    rows = [json.loads(x) for x in EXAMPLE_TRACE.read_text().splitlines()]
    trace = Trace(EXAMPLE_TRACE, endpoint="completions")
    wl = trace.build(6, seed=0)
    for r, row in zip(wl.requests, rows):
        assert tc.completion(r.prompt) == row["input_len"] and r.max_output_tokens == row["output_len"]
    arr = trace.arrivals(time_scale=0.5)
    assert arr.offsets(3) == pytest.approx([0.0, (rows[1]["t"] - rows[0]["t"]) / 2, (rows[2]["t"] - rows[0]["t"]) / 2])
    assert arr.count_for(5.0) == sum(1 for x in rows if (x["t"] - rows[0]["t"]) / 2 < 5.0)
    assert trace.default_arrivals() == TraceArrivals(str(EXAMPLE_TRACE))
    assert arr.peak_rate >= 4  # the burst: ~6 req/s, twice as fast
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 1, "input_len": 5, "output_len": 2}\n{"t": 0.5, "input_len": 5, "output_len": 2}\n')
    with pytest.raises(ValueError, match="sort the trace"):
        Trace(bad).rows()
    with pytest.raises(ValueError, match="holds 76 requests"):
        trace.build(77)
