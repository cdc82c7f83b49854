"""The field's dependency tree (the capstone's Module 10.1): two root facts, the consequences that follow from them,
and every technique of the series hanging off those, each node carrying the learner's own evidence.

The tree is fixed (it is the course's argument); the evidence is this run's. A lab passes, per node, an
:class:`Evidence`: the number, the lab it comes from, and whether this run measured it, an earlier lab saved it on
this device, or it is a prediction. A node with no evidence says which lab measures it. :func:`trace` answers the
capstone's check question — trace any technique back up the tree to a root fact — with the evidence on every edge::

    ev = {"decode": dependency_tree.Evidence("weights streamed at 9.8 GB/s, 61% of 16 GB/s", "24", "measured here")}
    dependency_tree.trace("fp8", ev)          # FP8 -> decode is memory-bound -> root facts 1 and 2, as a table
    dependency_tree.chart(ev, highlight="fp8")

Introduced in lab 24 (Putting It All Together).
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import pandas as pd

__all__ = ["Node", "Evidence", "NODES", "STATUSES", "node", "techniques", "path_to_root", "trace", "table", "chart"]

#: How a number came to be: measured in this run, saved by an earlier lab on this device, predicted from a model
#: or a catalog, or not read here (the node then names the lab that measures it).
STATUSES = ("measured here", "saved here by an earlier lab", "predicted", "not read here")


@dataclass(frozen=True)
class Node:
    """One fact or technique: ``key``, a short ``label``, the seed's module (``Mod 05``), the labs that teach it,
    ``parents`` (the facts it follows from) and ``level`` (0 root fact, 1 consequence, 2 technique, 3 operation).

    Introduced in lab 24 (Putting It All Together).
    """

    key: str
    label: str
    module: str
    labs: tuple[str, ...]
    parents: tuple[str, ...] = ()
    level: int = 2
    why: str = ""


@dataclass(frozen=True)
class Evidence:
    """A node's number as this series produced it: ``text`` (the number, in words), ``lab`` (where it comes from)
    and ``status`` (one of :data:`STATUSES`).

    Introduced in lab 24 (Putting It All Together).
    """

    text: str
    lab: str
    status: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"evidence status {self.status!r}: use one of {', '.join(STATUSES)}")
        if not self.text.strip():
            raise ValueError("evidence with no text: say the number, or leave the node out (it then names its lab)")


NODES: tuple[Node, ...] = (
    Node("autoregressive", "LLMs generate one token at a time", "Mod 00", ("02",), level=0,
         why="every output token is one forward pass over the whole context"),
    Node("budgets", "GPUs have separate compute and memory budgets", "Mod 01", ("05",), level=0,
         why="FLOP/s and bytes/s are different ceilings; a step is bound by whichever it hits first"),
    Node("decode", "decode is memory-bound", "Mod 02", ("02", "05"), ("autoregressive", "budgets"), level=1,
         why="one token per step reads every weight once: bytes, not FLOPs, set the step time"),
    Node("prefill", "prefill is compute-bound", "Mod 02", ("02", "05"), ("budgets",), level=1,
         why="a prompt's tokens go through the weights together: FLOPs set the time"),
    Node("kv", "the KV cache grows with every token and limits the batch", "Mod 02", ("03", "04", "06"),
         ("autoregressive", "budgets"), level=1,
         why="each token's keys and values stay for the rest of the request, in the memory the batch shares"),
    Node("metrics", "TTFT, TPOT, goodput: latency traded for throughput", "Mod 03", ("10", "11"),
         ("decode", "prefill"), why="prefill sets TTFT, decode sets TPOT, the batch trades one for the other"),
    Node("batching", "continuous batching", "Mod 05", ("07",), ("decode",),
         why="one read of the weights serves every request in the batch"),
    Node("paged", "PagedAttention", "Mod 05", ("06",), ("kv",),
         why="blocks instead of one slab per request: no memory reserved for tokens not yet written"),
    Node("prefix", "prefix caching", "Mod 05", ("09",), ("kv", "prefill"),
         why="a shared prompt's KV blocks are computed once and reused: prefill compute saved"),
    Node("chunked", "chunked prefill", "Mod 05", ("08",), ("prefill", "decode"),
         why="a long prompt in one step stalls every decoding stream; a token budget splits it"),
    Node("speculative", "speculative decoding", "Mod 05", ("16",), ("autoregressive", "decode"),
         why="verify several drafted tokens for one read of the weights"),
    Node("fp8", "FP8 / INT4 quantization", "Mod 04", ("12", "13", "14", "15"), ("decode", "kv"),
         why="fewer bytes per weight and per cached token: faster decode, more requests in memory"),
    Node("engine", "vLLM's flags", "Mod 06", ("01", "06", "08"), ("kv", "decode"),
         why="the engine implements the techniques; the flags size its KV pool, batch and token budget"),
    Node("tp", "tensor parallelism", "Mod 07", ("18",), ("budgets", "decode"),
         why="more cards: more memory and bandwidth per step, paid for in all-reduces"),
    Node("ep", "expert parallelism", "Mod 07", ("19",), ("budgets",),
         why="an MoE reads only its routed experts; spreading them spreads the memory"),
    Node("pd", "prefill/decode disaggregation", "Mod 07", ("20",), ("prefill", "decode"),
         why="compute-bound and memory-bound work interfere in one batch; separate pools stop it"),
    Node("offload", "KV offload tiers", "Mod 07", ("21",), ("kv", "prefill"),
         why="an evicted prefix reloaded from a slower tier instead of recomputed"),
    Node("routing", "prefix-aware routing", "Mod 08", ("22",), ("prefix",), level=3,
         why="a request sent where its prefix is cached keeps the hit rate of one server across many"),
    Node("autoscaling", "queue-based autoscaling", "Mod 08", ("22",), ("metrics",), level=3,
         why="the queue grows before latency does: scale on it"),
    Node("slo", "SLO alerts and postmortems", "Mod 08", ("23",), ("metrics",), level=3,
         why="burn rates of the TTFT/TPOT budget say when users feel it"),
    Node("cost", "cost per million tokens within the SLO", "Mod 09", ("17", "24"), ("metrics", "batching"), level=3,
         why="goodput per dollar: the throughput that meets the SLO, priced"),
)
_BY_KEY = {n.key: n for n in NODES}


def node(key: str) -> Node:
    """The node called ``key`` (an unknown key says which exist).

    Introduced in lab 24 (Putting It All Together).
    """
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"no node {key!r} in the dependency tree; known: {', '.join(_BY_KEY)}") from None


def techniques() -> list[str]:
    """The keys a learner can trace: every node that is not a root fact.

    Introduced in lab 24 (Putting It All Together).
    """
    return [n.key for n in NODES if n.level > 0]


def path_to_root(key: str) -> list[tuple[str, str]]:
    """Every edge (child, parent) from ``key`` up to the root facts, nearest first, each edge once.

    Introduced in lab 24 (Putting It All Together).
    """
    edges, frontier, seen = [], [node(key).key], set()
    while frontier:
        child = frontier.pop(0)
        for parent in node(child).parents:
            if (child, parent) not in seen:
                seen.add((child, parent))
                edges.append((child, parent))
                frontier.append(parent)
    return edges


def _evidence(key: str, evidence: dict[str, Evidence]) -> Evidence:
    ev = evidence.get(key)
    if ev is not None:
        return ev
    labs = node(key).labs
    return Evidence(f"lab {' / '.join(labs)} measures it", labs[0], "not read here")


def table(evidence: dict[str, Evidence]) -> pd.DataFrame:
    """Every node with its evidence (a node without any names the lab that measures it: 'not read here').

    Introduced in lab 24 (Putting It All Together).
    """
    unknown = sorted(set(evidence) - set(_BY_KEY))
    if unknown:
        raise KeyError(f"evidence for nodes the tree does not have: {unknown}; known: {', '.join(_BY_KEY)}")
    rows = []
    for n in NODES:
        ev = _evidence(n.key, evidence)
        rows.append({"node": n.label, "key": n.key, "level": n.level, "module": n.module,
                     "labs": ", ".join(n.labs), "follows from": ", ".join(node(p).label for p in n.parents),
                     "evidence": ev.text, "from lab": ev.lab, "status": ev.status})
    return pd.DataFrame(rows)


def trace(key: str, evidence: dict[str, Evidence]) -> pd.DataFrame:
    """The capstone's check question answered for ``key``: each edge up to a root fact, why it holds and the
    evidence for the fact at each end.

    Introduced in lab 24 (Putting It All Together).
    """
    rows = []
    for child, parent in path_to_root(key):
        c, p = _evidence(child, evidence), _evidence(parent, evidence)
        rows.append({"from": node(child).label, "because": node(parent).label, "why": node(child).why,
                     "evidence (from)": f"{c.text} [lab {c.lab}, {c.status}]",
                     "evidence (because)": f"{p.text} [lab {p.lab}, {p.status}]"})
    return pd.DataFrame(rows)


def chart(evidence: dict[str, Evidence], highlight: str | None = None) -> alt.LayerChart:
    """The tree drawn: root facts at the top, techniques below, each node coloured by how its number came to be;
    ``highlight`` draws its path to the roots in bold.

    Introduced in lab 24 (Putting It All Together).
    """
    nodes = table(evidence)
    # a layered layout: each level ordered by where its parents sit (fewer crossings), spread evenly across
    x: dict[str, float] = {}
    for level in sorted(nodes["level"].unique()):
        keys = [n.key for n in NODES if n.level == level]
        keys.sort(key=lambda k: sum(x[p] for p in node(k).parents) / len(node(k).parents) if node(k).parents else 0)
        x.update({k: (i + 0.5) / len(keys) for i, k in enumerate(keys)})
    nodes["x"] = nodes["key"].map(x)
    nodes = nodes.sort_values(["level", "x"]).reset_index(drop=True)
    pos = nodes.set_index("key")[["x", "level"]]
    on_path = set(path_to_root(highlight)) if highlight else set()
    lit = {k for e in on_path for k in e} | ({highlight} if highlight else set())
    edges = pd.DataFrame([{"edge": f"{n.key}->{p}", "x": pos.loc[k, "x"], "level": pos.loc[k, "level"],
                           "on path": (n.key, p) in on_path}
                          for n in NODES for p in n.parents for k in (n.key, p)])
    nodes["on path"] = nodes["key"].isin(lit)
    # labels above and below their dots in turn, so neighbours on a crowded level do not overlap
    nodes["label at"] = nodes["level"] + nodes.groupby("level").cumcount().mod(2).map({0: -0.28, 1: 0.3})
    scale = alt.Scale(domain=list(STATUSES), range=["#1b9e77", "#7570b3", "#d95f02", "#bbbbbb"])
    xs = alt.X("x:Q", axis=None, scale=alt.Scale(domain=[0, 1]))
    levels = alt.Scale(domain=[-0.5, 3.5], reverse=True)
    y = alt.Y("level:Q", axis=None, scale=levels)
    lines = alt.Chart(edges).mark_line().encode(
        x=xs, y=y, detail="edge:N", strokeWidth=alt.condition("datum['on path']", alt.value(3), alt.value(0.6)),
        color=alt.condition("datum['on path']", alt.value("#333333"), alt.value("#cccccc")))
    dots = alt.Chart(nodes).mark_circle().encode(
        x=xs, y=y, color=alt.Color("status:N", scale=scale, title="the number is"),
        size=alt.condition("datum['on path']", alt.value(260), alt.value(120)),
        tooltip=["node", "module", "labs", "evidence", "status"])
    labels = alt.Chart(nodes).mark_text(fontSize=9).encode(
        x=xs, y=alt.Y("label at:Q", axis=None, scale=levels), text="node:N",
        opacity=alt.condition("datum['on path']", alt.value(1.0), alt.value(0.55)))
    title = f"the field's dependency tree: {node(highlight).label} traced to its root facts" if highlight else \
        "the field's dependency tree"
    return (lines + dots + labels).properties(width=980, height=360, title=title)
