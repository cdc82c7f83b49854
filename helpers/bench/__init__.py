"""The benchmark harness: arrivals, workloads, a streaming client, honest statistics, saved runs, searches.

::

    from helpers import bench

    wl = bench.FixedLength(input_len=256, output_len=64, endpoint="chat")
    res = bench.run(wl, bench.Poisson(rate=4), base_url=srv, num_requests=200, warmup=8,
                    slo=bench.SLO(ttft_ms=500, tpot_ms=50))
    print(res)                   # summary table; res.df one row per request; res.summary.ttft_ms.p99
    bench.charts.cdf(res, "ttft")

    big = bench.run(wl, bench.Poisson(rate=200), base_url=srv, duration_s=60, workers="auto")
    big.summary.valid            # False when the client, not the server, set the numbers (invalid_reason says how)
    best = bench.find_max_rate(wl, bench.SLO(ttft_ms=500, tpot_ms=50), attainment=0.9, base_url=srv)

``python -m helpers.bench run ...`` does the same from a shell; ``python -m helpers.bench.calibration``
starts a server with known latencies to check any load generator against.

Modules, leaves first (each imports only those before it): ``records`` (typed request records; every metric
defined once) -> ``arrivals``, ``workloads`` (+ ``lengths``, ``conversations``, ``traces``), ``client``,
``health`` (is the client the bottleneck?) -> ``dispatch`` (sending from one event loop) -> ``workers`` (from
several processes); ``options`` (a run's size, sending and recording: typed groups); ``stats`` (distributions,
windows, the two goodputs; no files) -> ``store`` (a run's folder; :class:`RunResult`; :func:`load_run`) ->
``charts``; ``harness`` (a run's thread) -> ``runner`` (:func:`run`)
-> ``batching`` (static batches, for comparison), ``search`` (:func:`sweep`, :func:`find_max_rate`) -> ``report``
(the Phase 2 artifact). ``calibration`` stands apart (a server with known latencies, on one or N processes).
"""

from . import charts
from .arrivals import Arrivals, Concurrent, ConstantRate, Poisson, Ramp, Steps, Synchronous, make_arrivals
from .batching import decode_steps_ms, interpolate, joined_and_left, static_batches, with_output_lengths
from .calibration import CalibrationConfig, CalibrationServer
from .client import ClientConfig, StreamParser, build_payload
from .conversations import CONVERSATIONS, Conversations
from .health import ClientLimits, LoopHealth
from .options import Recording, Sending, Size
from .lengths import Histogram, LengthDist, Normal, Uniform, VariableLength, parse_length
from .records import Request, RequestResult, Timings, chunk_gaps, itl_values
from .report import BenchmarkReport, ConfigResult
from .runner import Target, choose_workers, reconcile, run, stall_load, stall_pacing, target_of, together
from .search import Capacity, MaxRateResult, Probe, Remeasure, SweepResult, capacity, find_max_rate, sweep
from .stats import (SLO, Comparison, Distribution, Goodput, Latencies, Summary, Window, bootstrap_quantile,
                    metric_values, pooled_itl_median, quantile_with_ci, steady_state_window, summarize,
                    requests_to_show, tracking, wilson_interval)
from .store import RunFolder, RunResult, compare, goodput, load_run, records_of
from .traces import EXAMPLE_TRACE, Trace, TraceArrivals
from .workloads import (SAMPLE_CHAT, FixedLength, FromJsonl, SharedPrefix, TokenCounter, Workload, WorkloadSpec,
                        load_tokenizer, token_counter)

__all__ = [
    # records
    "Request", "RequestResult", "Timings", "itl_values", "chunk_gaps",
    # workloads
    "Workload", "WorkloadSpec", "FixedLength", "SharedPrefix", "FromJsonl", "TokenCounter", "load_tokenizer",
    "token_counter", "SAMPLE_CHAT", "VariableLength", "LengthDist", "Uniform", "Normal", "Histogram", "parse_length",
    "Conversations", "CONVERSATIONS", "Trace", "TraceArrivals", "EXAMPLE_TRACE",
    # arrivals
    "Arrivals", "Synchronous", "Concurrent", "ConstantRate", "Poisson", "Ramp", "Steps", "make_arrivals",
    # client
    "ClientConfig", "StreamParser", "build_payload", "ClientLimits", "LoopHealth",
    # running and saved runs
    "run", "Size", "Sending", "Recording", "together", "stall_load", "stall_pacing", "Target", "target_of", "reconcile", "choose_workers", "RunResult", "RunFolder", "load_run", "records_of",
    # static batching, for comparison; reading a measured curve
    "static_batches", "with_output_lengths", "decode_steps_ms", "interpolate", "joined_and_left",
    # searches
    "sweep", "SweepResult", "capacity", "Capacity", "find_max_rate", "MaxRateResult", "Probe", "Remeasure",
    # statistics
    "SLO", "Summary", "Distribution", "Latencies", "Window", "Goodput", "Comparison", "summarize",
    "steady_state_window", "tracking", "goodput", "compare", "metric_values", "bootstrap_quantile", "pooled_itl_median",
    "quantile_with_ci", "requests_to_show", "wilson_interval",
    # calibration
    "CalibrationServer", "CalibrationConfig",
    # the Phase 2 report
    "BenchmarkReport", "ConfigResult",
    # charts
    "charts",
]
