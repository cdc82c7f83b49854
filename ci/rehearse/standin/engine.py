"""The stand-in's engine: vLLM V1's scheduler and KV block pool, stepped in real time at the card's roofline speed.

What it keeps from vLLM 0.32 (``v1/core/sched/scheduler.py``, ``v1/core/kv_cache_manager.py``,
``v1/core/block_pool.py``), because the labs measure it:

- each step first continues the running requests in order (a decode token each, or their next prefill chunk), then
  admits waiting ones while the token budget (``max_num_batched_tokens``) and ``max_num_seqs`` allow; a prefill longer
  than the budget is chunked, and ``long_prefill_token_threshold`` caps a request's chunk;
- KV blocks of ``block_size`` tokens from a pool of ``num_blocks`` (one of them the null block, never handed out); a
  request that cannot get its blocks preempts the last running request (recompute: its blocks are freed, it waits
  again at the front);
- prefix caching: each full block is hashed with everything before it (and the request's ``cache_salt``); a new
  request takes the longest run of cached blocks, at most ``prompt - 1`` tokens; freed blocks keep their hash until
  the pool hands them out again, least recently freed first (a request's blocks are freed tail first);
- the counters and histograms ``v1/metrics`` derives from these events (``metrics.py`` renders them);
- speculative decoding (n-gram prompt lookup, or a draft head modelled by an acceptance rate), and the
  ``ExampleConnector``'s disk store (files per layer, named by a hash of the prompt's block-aligned tokens).

A step takes what the card's roofline says (weights and KV read over bandwidth, FLOPs over compute, whichever is
longer, at the shares a real engine reaches), plus a fixed cost; ``STANDIN_SPEED`` > 1 runs the card faster.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import math
import os
import random
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import lm as _lm

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass
class Timing:
    """What a step costs on the served card: bytes over bandwidth or FLOPs over compute, plus a fixed cost."""

    weight_bytes: float           # read once per step (per card, after tensor parallel)
    active_params: float          # per token (per card)
    kv_bytes_per_token: float     # per card
    attn_flops_per_token_ctx: float  # 4 x layers x heads x head_dim / tp
    bandwidth: float              # bytes/s achieved
    flops: float                  # FLOP/s achieved in the compute dtype
    fixed_s: float = 0.0004       # launch, sampling, scheduling per step
    per_seq_s: float = 2e-6
    comm_s_per_token: float = 0.0  # tensor-parallel all-reduces, per token of the step
    speed: float = 1.0

    def step(self, decode_ctx: list[int], prefill: list[tuple[int, int]]) -> float:
        """Seconds for one step: ``decode_ctx`` the context of each decoding sequence (one token each, or more with
        drafts), ``prefill`` (chunk tokens, context before the chunk) for each prefilling one."""
        tokens = len(decode_ctx) + sum(n for n, _ in prefill)
        kv_read = sum(decode_ctx) * self.kv_bytes_per_token + sum((c + n) * self.kv_bytes_per_token
                                                                  for n, c in prefill)
        flops = 2 * self.active_params * tokens + self.attn_flops_per_token_ctx * (
            sum(decode_ctx) + sum(n * (c + n / 2) for n, c in prefill))
        t = max((self.weight_bytes + kv_read) / self.bandwidth, flops / self.flops)
        t += self.fixed_s + self.per_seq_s * (len(decode_ctx) + len(prefill)) + self.comm_s_per_token * tokens
        return t / self.speed


@dataclass
class Sampling:
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    include_stop: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True


class Request:
    """One sequence in the engine (a request with ``n`` > 1 is ``n`` of these)."""

    def __init__(self, rid: str, prompt: list[int], sampling: Sampling, *, arrival: float, cache_salt: str | None,
                 kv_transfer: dict[str, Any] | None = None):
        self.id = rid
        self.prompt = list(prompt)
        self.tokens = list(prompt)        # prompt + output
        self.sampling = sampling
        self.arrival = arrival
        self.cache_salt = cache_salt
        self.kv_transfer = kv_transfer
        self.status = WAITING
        self.computed = 0
        self.blocks: list[int] = []
        self.hashes: list[bytes] = []
        self.num_preemptions = 0
        self.queued_ts = arrival
        self.scheduled_ts = 0.0
        self.first_token_ts = 0.0
        self.last_token_ts = 0.0
        self.generated = 0
        self.cached_tokens = 0            # local prefix-cache hit at first admission
        self.external_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.spec: list[int] = []         # drafts proposed for the next step
        self.index = _lm.bigram_index(self.tokens)
        self.rng = random.Random(sampling.seed) if sampling.seed is not None else random.Random()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.prefill_done = False

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.prompt)


class Block:
    __slots__ = ("id", "ref", "hash")

    def __init__(self, i: int):
        self.id, self.ref, self.hash = i, 0, None


class BlockPool:
    """``num_blocks`` blocks, block 0 the null block; free blocks in least-recently-freed order; cached by hash."""

    def __init__(self, num_blocks: int, caching: bool):
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict((i, None) for i in range(1, num_blocks))
        self.cached: dict[bytes, int] = {}
        self.caching = caching
        self.usable = max(num_blocks - 1, 1)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.usable

    def take(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            i, _ = self.free.popitem(last=False)
            b = self.blocks[i]
            if b.hash is not None:
                if self.cached.get(b.hash) == i:
                    del self.cached[b.hash]
                b.hash = None
            b.ref = 1
            out.append(i)
        return out

    def touch(self, ids: list[int]) -> None:
        for i in ids:
            b = self.blocks[i]
            if b.ref == 0:
                self.free.pop(i, None)
            b.ref += 1

    def release(self, ids: list[int]) -> None:
        for i in reversed(ids):  # tail first: the end of a prompt is evicted before its shared head
            b = self.blocks[i]
            b.ref -= 1
            if b.ref == 0:
                self.free[i] = None

    def cache(self, i: int, h: bytes) -> None:
        if not self.caching:
            return
        b = self.blocks[i]
        if b.hash is None and h not in self.cached:
            b.hash = h
            self.cached[h] = i

    def reset(self) -> bool:
        if any(b.ref for b in self.blocks[1:]):
            return False
        for b in self.blocks:
            b.hash = None
        self.cached.clear()
        return True


def block_hash(parent: bytes | None, tokens: list[int], salt: str | None) -> bytes:
    m = hashlib.sha256(parent or b"root")
    if parent is None and salt:
        m.update(salt.encode())
    m.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return m.digest()


@dataclass
class Config:
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    spec_method: str | None = None
    spec_k: int = 0
    spec_acceptance: float = 0.7     # a draft head's per-position acceptance (n-gram drafts are checked for real)
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    kv_role: str | None = None       # kv_producer, kv_consumer, kv_both (ExampleConnector)
    kv_store: Path | None = None
    kv_layers: list[str] = field(default_factory=list)
    kv_bytes_per_token_layer: int = 0
    kv_dtype_name: str = "BF16"


class Engine:
    def __init__(self, cfg: Config, timing: Timing, model: _lm.LM, stats: Any):
        self.cfg = cfg
        self.timing = timing
        self.lm = model
        self.stats = stats
        self.pool = BlockPool(cfg.num_blocks, cfg.prefix_caching)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.steps = 0

    # ------------------------------------------------------------------------------ requests
    def add(self, req: Request) -> None:
        self.stats.request_added(req)
        self.waiting.append(req)
        self.wake.set()

    def abort(self, req: Request) -> None:
        req.cancelled = True
        self.wake.set()

    def start(self) -> None:
        self.task = asyncio.get_event_loop().create_task(self._loop())

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset()

    # ------------------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        loop = asyncio.get_event_loop()
        while True:
            self._drop_cancelled()
            if not self.waiting and not self.running:
                self.stats.gauges(0, 0, self.pool.usage())
                self.wake.clear()
                await self.wake.wait()
                continue
            t0 = loop.time()
            plan = self._schedule()
            if not plan:
                self.stats.gauges(len(self.running), len(self.waiting), self.pool.usage())
                await asyncio.sleep(0.005)
                continue
            dt = self._duration(plan)
            self.stats.gauges(len(self.running), len(self.waiting), self.pool.usage())
            await asyncio.sleep(max(0.0, t0 + dt - loop.time()))
            self._apply(plan, time.time())
            self.steps += 1

    def _drop_cancelled(self) -> None:
        for q in (self.running, self.waiting):
            for r in [r for r in q if r.cancelled]:
                q.remove(r)
                self._free(r)
                r.status = FINISHED

    # ------------------------------------------------------------------------------ scheduling
    def _need_blocks(self, req: Request, upto: int) -> int:
        return max(0, math.ceil(upto / self.cfg.block_size) - len(req.blocks))

    def _allocate(self, req: Request, num_new: int, lookahead: int = 0) -> bool:
        need = self._need_blocks(req, req.computed + num_new + lookahead)
        if need == 0:
            return True
        got = self.pool.take(need)
        if got is None:
            return False
        req.blocks += got
        return True

    def _free(self, req: Request) -> None:
        self.pool.release(req.blocks)
        req.blocks = []

    def _preempt(self, req: Request, now: float) -> None:
        self._free(req)
        req.computed = 0
        req.status = WAITING
        req.num_preemptions += 1
        req.spec = []
        self.stats.preempted(req)
        self.waiting.appendleft(req)

    def _cache_hit(self, req: Request) -> int:
        """Blocks of the longest cached run of ``req``'s full blocks (at most ``len - 1`` tokens), taken."""
        bs = self.cfg.block_size
        self._hash_upto(req, len(req.tokens))
        limit = (len(req.tokens) - 1) // bs
        hit: list[int] = []
        if self.cfg.prefix_caching and req.sampling.prompt_logprobs is None:
            for h in req.hashes[:limit]:
                i = self.pool.cached.get(h)
                if i is None:
                    break
                hit.append(i)
        self.pool.touch(hit)
        req.blocks = hit
        return len(hit) * bs

    def _hash_upto(self, req: Request, n: int) -> None:
        bs = self.cfg.block_size
        while (len(req.hashes) + 1) * bs <= n:
            k = len(req.hashes)
            req.hashes.append(block_hash(req.hashes[-1] if req.hashes else None, req.tokens[k * bs:(k + 1) * bs],
                                         req.cache_salt))

    def _external_hit(self, req: Request, computed: int) -> int:
        if self.cfg.kv_role not in ("kv_consumer", "kv_both") or self.cfg.kv_store is None:
            return 0
        n = _align(len(req.prompt) - 1, self.cfg.block_size)
        if n <= computed or not _store_folder(self.cfg.kv_store, req.prompt[:n]).exists():
            return 0
        return n - computed

    def _schedule(self) -> dict[str, Any] | None:
        budget = self.cfg.max_num_batched_tokens
        thr = self.cfg.long_prefill_token_threshold
        scheduled: list[tuple[Request, int, list[int]]] = []
        preempted = False
        now = time.time()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            drafts = req.spec
            want = len(req.tokens) + len(drafts) - req.computed
            if thr and want > thr:
                want = thr
            n = min(want, budget)
            ok = self._allocate(req, n)
            while not ok:
                victim = self.running.pop()
                self._preempt(victim, now)
                preempted = True
                if victim is req:
                    break
                ok = self._allocate(req, n)
            if not ok:
                break
            spec = drafts[: max(0, req.computed + n - len(req.tokens))]
            scheduled.append((req, n, spec))
            budget -= n
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
                req = self.waiting[0]
                first = req.num_preemptions == 0
                local = self._cache_hit(req)
                external = self._external_hit(req, local)
                req.computed = local + external
                want = len(req.tokens) - req.computed
                if thr and want > thr:
                    want = thr
                n = min(want, budget)
                if not self._allocate(req, n):
                    self._free(req)  # the cache hit's blocks go back: nothing was admitted
                    req.computed = 0
                    break
                # recorded at admission, so a lookup that was not admitted is not counted (scheduler.py)
                if req.sampling.prompt_logprobs is None and self.cfg.prefix_caching:
                    self.stats.prefix_query(len(req.tokens), local, preempted=not first)
                if self.cfg.kv_role in ("kv_consumer", "kv_both"):
                    self.stats.connector_query(len(req.tokens) - local, external, preempted=not first)
                if first:
                    req.cached_tokens, req.external_tokens = local, external
                self.waiting.popleft()
                req.status = RUNNING
                if req.scheduled_ts == 0.0:
                    req.scheduled_ts = now
                    self.stats.scheduled(req)
                self.running.append(req)
                scheduled.append((req, n, []))
                budget -= n
        if not scheduled:
            return None
        return {"scheduled": scheduled}

    def _duration(self, plan: dict[str, Any]) -> float:
        decode, prefill = [], []
        for req, n, spec in plan["scheduled"]:
            if req.computed >= len(req.prompt):
                decode.extend([req.computed] * n)
            else:
                prefill.append((n, req.computed))
        return self.timing.step(decode, prefill)

    # ------------------------------------------------------------------------------ results
    def _apply(self, plan: dict[str, Any], now: float) -> None:
        tokens_this_step = 0
        prompt_computed = 0
        for req, n, spec in plan["scheduled"]:
            if req.status != RUNNING:
                continue
            before = req.computed
            req.computed += n
            if before < len(req.prompt):
                prompt_computed += min(req.computed, len(req.prompt)) - before
            self._hash_upto(req, min(req.computed, len(req.tokens)))
            for k, h in enumerate(req.hashes):
                if k < len(req.blocks):
                    self.pool.cache(req.blocks[k], h)
            if req.computed < len(req.tokens) and not spec:
                continue  # a prefill chunk that did not reach the end of the prompt
            new = self._sample(req, spec)
            if not req.prefill_done:
                req.prefill_done = True
                self._store_kv(req)
            tokens_this_step += len(new)
            self._emit(req, new, now)
        self.stats.iteration(prompt_computed, tokens_this_step)
        self._propose()

    def _sample(self, req: Request, spec: list[int]) -> list[int]:
        """The tokens this step produces for ``req``: drafts the target agrees with, then one of its own."""
        s = req.sampling
        out: list[int] = []
        accepted = 0
        if spec:
            # the drafts were scheduled as tokens: roll back to the verified prefix
            req.computed -= len(spec)
            for k, d in enumerate(spec):
                if not self._accepts(req, d, k):
                    break
                out.append(d)
                accepted += 1
            self.stats.spec(len(spec), accepted)
        for t in out:
            self._append(req, t)
        if not self._finished(req):
            t = self.lm.next(req.tokens, req.index, greedy=s.temperature == 0, rng=req.rng,
                             allow_eos=not s.ignore_eos and req.num_output >= s.min_tokens)
            self._append(req, t)
            out.append(t)
        req.computed = len(req.tokens) - 1
        return out

    def _accepts(self, req: Request, draft: int, position: int) -> bool:
        want = self.lm.next(req.tokens, req.index, greedy=True, rng=None, allow_eos=False)
        if self.cfg.spec_method == "ngram":
            return draft == want
        return draft == want and random.Random(hash((req.id, len(req.tokens)))).random() < \
            self.cfg.spec_acceptance

    def _append(self, req: Request, t: int) -> None:
        req.tokens.append(t)
        _lm.extend_index(req.index, req.tokens, len(req.tokens) - 1)

    def _finished(self, req: Request) -> bool:
        s = req.sampling
        if req.num_output >= s.max_tokens or len(req.tokens) >= self.cfg.max_model_len:
            return True
        return bool(req.num_output and req.tokens[-1] == self.lm.eos_id and not s.ignore_eos
                    and req.num_output > s.min_tokens - 1)

    def _emit(self, req: Request, new: list[int], now: float) -> None:
        first = req.first_token_ts == 0.0
        if first:
            req.first_token_ts = now
        self.stats.tokens(req, len(new), now, first)
        req.last_token_ts = now
        req.generated += len(new)
        done = self._finished(req)
        if done:
            eos = req.tokens[-1] == self.lm.eos_id and not req.sampling.ignore_eos
            self._finish(req, "stop" if eos else "length")
        req.events.put_nowait(("tokens", new, done))

    def _finish(self, req: Request, reason: str, stop_reason: Any = None) -> None:
        req.finish_reason, req.stop_reason = reason, stop_reason
        req.status = FINISHED
        if req in self.running:
            self.running.remove(req)
        self._free(req)
        self.stats.finished(req)

    def stop_string(self, req: Request, reason: Any) -> None:
        """The API server found a stop string in the text: the request ends now."""
        if req.status != FINISHED:
            self._finish(req, "stop", reason)

    def _propose(self) -> None:
        if not self.cfg.spec_method:
            return
        for req in self.running:
            if req.computed < len(req.prompt) or req.status != RUNNING:
                req.spec = []
                continue
            room = req.sampling.max_tokens - req.num_output - 1
            k = min(self.cfg.spec_k, max(room, 0))
            if k <= 0:
                req.spec = []
                continue
            if self.cfg.spec_method == "ngram":
                req.spec = _prompt_lookup(req.tokens, self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max, k)
            else:  # a draft head: it proposes what the target would say; acceptance is modelled in _accepts
                ctx, idx = list(req.tokens), dict(req.index)
                drafts = []
                for _ in range(k):
                    t = self.lm.next(ctx, idx, greedy=True, rng=None, allow_eos=False)
                    drafts.append(t)
                    ctx.append(t)
                    _lm.extend_index(idx, ctx, len(ctx) - 1)
                req.spec = drafts

    # ------------------------------------------------------------------------------ KV connector
    def _store_kv(self, req: Request) -> None:
        if self.cfg.kv_role not in ("kv_producer", "kv_both") or self.cfg.kv_store is None or req.external_tokens:
            return
        n = _align(len(req.prompt), self.cfg.block_size)
        if n <= 0:
            return
        check = _align(len(req.prompt) - 1, self.cfg.block_size)
        if _store_folder(self.cfg.kv_store, req.prompt[:check]).exists():
            return
        folder = _store_folder(self.cfg.kv_store, req.prompt[:n])
        folder.mkdir(parents=True, exist_ok=True)
        for layer in self.cfg.kv_layers:
            _sparse_safetensors(folder / f"{layer}.safetensors", "kv_cache", self.cfg.kv_dtype_name,
                                [n, self.cfg.kv_bytes_per_token_layer // 2 // _DT[self.cfg.kv_dtype_name], 2],
                                n * self.cfg.kv_bytes_per_token_layer)


_DT = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E5M2": 1, "U8": 1}


def _align(n: int, bs: int) -> int:
    return (n - 1) // bs * bs


def _store_folder(root: Path, tokens: list[int]) -> Path:
    data = struct.pack(f"<{len(tokens)}q", *tokens)
    return root / hashlib.md5(data, usedforsecurity=False).hexdigest()


def _sparse_safetensors(path: Path, name: str, dtype: str, shape: list[int], nbytes: int) -> None:
    import json

    header = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        fh.truncate(8 + len(header) + nbytes)


def _prompt_lookup(tokens: list[int], nmin: int, nmax: int, k: int) -> list[int]:
    """vLLM's n-gram proposer: the longest suffix of ``nmin``..``nmax`` tokens seen earlier, and what followed it."""
    L = len(tokens)
    for n in range(min(nmax, L - 1), nmin - 1, -1):
        suffix = tokens[L - n:]
        for start in range(L - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
                break
    return []


def speed() -> float:
    try:
        return float(os.environ.get("STANDIN_SPEED", "1") or 1)
    except ValueError:
        return 1.0


__all__ = ["Engine", "Config", "Timing", "Request", "Sampling", "BlockPool", "block_hash", "speed"]
_unused: Callable | None = None
