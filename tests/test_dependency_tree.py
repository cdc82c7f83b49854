"""helpers.dependency_tree: the capstone's tree of the field (Module 10.1), traced with a run's evidence."""

import json

import pytest

from helpers import dependency_tree as dt
from helpers.widgets import render_chart

ROOTS = {n.key for n in dt.NODES if n.level == 0}


def test_the_tree_is_the_seeds_two_root_facts_and_every_technique_reaches_both_or_one():
    assert ROOTS == {"autoregressive", "budgets"}
    keys = [n.key for n in dt.NODES]
    assert len(keys) == len(set(keys))
    for n in dt.NODES:
        assert all(dt.node(p).level < n.level for p in n.parents), f"{n.key} hangs off a node at its level or below"
    for key in dt.techniques():
        reached = {parent for _, parent in dt.path_to_root(key)}
        assert reached & ROOTS, f"{key} does not trace back to a root fact"


def test_speculative_decoding_traces_to_both_root_facts_through_the_memory_bound_decode():
    edges = dt.path_to_root("speculative")
    assert ("speculative", "autoregressive") in edges and ("speculative", "decode") in edges
    assert ("decode", "budgets") in edges
    assert len(edges) == len(set(edges))  # the shared root reached twice is listed once per edge
    chunked = {p for _, p in dt.path_to_root("chunked")}
    assert {"prefill", "decode", "budgets"} <= chunked


def test_evidence_says_how_it_was_got_and_a_node_without_any_names_its_lab():
    with pytest.raises(ValueError, match="measured here"):
        dt.Evidence("3.1 ms", "24", "measured")
    with pytest.raises(ValueError, match="no text"):
        dt.Evidence("  ", "24", "predicted")
    ev = {"prefix": dt.Evidence("hit rate 0 -> 0.73", "24", "measured here")}
    table = dt.table(ev).set_index("key")
    assert table.loc["prefix", "status"] == "measured here" and table.loc["prefix", "evidence"] == "hit rate 0 -> 0.73"
    assert table.loc["pd", "status"] == "not read here" and "lab 20" in table.loc["pd", "evidence"]
    trace = dt.trace("routing", ev)
    assert list(trace["from"])[:2] == ["prefix-aware routing", "prefix caching"]
    assert "hit rate 0 -> 0.73 [lab 24, measured here]" in trace["evidence (because)"].iloc[0]


def test_unknown_keys_are_refused_with_the_known_ones():
    with pytest.raises(KeyError, match="known: autoregressive"):
        dt.path_to_root("flash attention")
    with pytest.raises(KeyError, match="does not have"):
        dt.table({"flash": dt.Evidence("1", "24", "predicted")})


def test_the_chart_draws_every_node_and_bolds_the_traced_path():
    ev = {"decode": dt.Evidence("9.8 GB/s, 61%", "24", "measured here")}
    spec = dt.chart(ev, highlight="fp8").to_dict()
    datasets = list(spec["datasets"].values())
    nodes = next(d for d in datasets if d and "node" in d[0])
    edges = next(d for d in datasets if d and "edge" in d[0])
    assert len(nodes) == len(dt.NODES)
    lit = {r["key"] for r in nodes if r["on path"]}
    assert lit == {"fp8", "decode", "kv", "autoregressive", "budgets"}
    assert {r["edge"] for r in edges if r["on path"]} == {f"{c}->{p}" for c, p in dt.path_to_root("fp8")}
    assert all(0 < r["x"] < 1 for r in nodes)
    out = render_chart(json.loads(json.dumps(spec)))  # an offline image, as every chart of the labs
    assert "image/png" in out
