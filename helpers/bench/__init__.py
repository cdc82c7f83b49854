"""The benchmark harness: load profiles, workloads, a streaming client, and honest statistics.

::

    from helpers import bench

    wl = bench.FixedLength(input_len=256, output_len=64, endpoint="chat")
    res = bench.run(wl, bench.Poisson(rate=4), base_url=srv.base_url, num_requests=200, warmup=8,
                    slo=bench.SLO(ttft_ms=500, tpot_ms=50))
    print(res)                   # summary table; res.df one row per request; res.summary.ttft_ms.p99
    bench.charts.cdf(res, "ttft")

``python -m helpers.bench run ...`` does the same from a shell; ``python -m helpers.bench.calibration``
starts a server with known latencies to check any load generator against.
"""

from . import charts
from .client import ClientConfig, StreamParser, build_payload
from .profiles import Concurrent, ConstantRate, LoadProfile, Poisson, Synchronous, make_profile
from .records import Request, RequestResult, Timings, itl_values
from .report import BenchmarkReport, ConfigResult
from .runner import (MaxRateResult, Probe, RunResult, SweepResult, find_max_rate, load_run, reconcile, run,
                     sweep)
from .stats import (SLO, Comparison, Distribution, Goodput, Summary, Window, bootstrap_quantile, compare,
                    goodput, metric_values, pooled_itl_median, steady_state_window, summarize)
from .workloads import (SAMPLE_CHAT, FixedLength, FromJsonl, SharedPrefix, TokenCounter, Workload, WorkloadSpec,
                        load_tokenizer, token_counter)

__all__ = [
    # records
    "Request", "RequestResult", "Timings", "itl_values",
    # workloads
    "Workload", "WorkloadSpec", "FixedLength", "SharedPrefix", "FromJsonl", "TokenCounter", "load_tokenizer",
    "token_counter", "SAMPLE_CHAT",
    # profiles
    "LoadProfile", "Synchronous", "Concurrent", "ConstantRate", "Poisson", "make_profile",
    # client
    "ClientConfig", "StreamParser", "build_payload",
    # running
    "run", "RunResult", "load_run", "sweep", "SweepResult", "find_max_rate", "MaxRateResult", "Probe", "reconcile",
    # statistics
    "SLO", "Summary", "Distribution", "Window", "Goodput", "Comparison", "summarize", "steady_state_window",
    "goodput", "compare", "metric_values", "bootstrap_quantile", "pooled_itl_median",
    # calibration
    "CalibrationServer", "CalibrationConfig",
    # the Phase 2 report
    "BenchmarkReport", "ConfigResult",
    # charts
    "charts",
]


def __getattr__(name: str):
    # The calibration server is imported lazily, so `python -m helpers.bench.calibration` runs cleanly.
    if name in ("CalibrationServer", "CalibrationConfig", "calibration"):
        import importlib

        module = importlib.import_module(f"{__name__}.calibration")
        return module if name == "calibration" else getattr(module, name)
    raise AttributeError(f"module 'helpers.bench' has no attribute {name!r}")
