"""``python -m helpers.bench``'s refusals: options that cannot mean what they say stop in one line, exit 2, before
any request or any question to the server (the address below has nothing listening: reaching it would say so)."""

import pytest

from helpers.bench import SLO, Size
from helpers.bench.__main__ import main

NOWHERE = ["run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--no-progress"]


@pytest.mark.parametrize("extra,said", [
    (["--rate", "4"], "without --arrivals a run sends one request at a time"),
    (["--arrivals", "concurrent", "--concurrency", "2", "--rate", "3"], "--arrivals concurrent ignores it"),
    (["--concurrency", "4"], "--concurrency is for --arrivals concurrent"),
    (["--num-requests", "-5"], "--num-requests must be at least 1"),
    (["--arrivals", "poisson", "--rate", "0"], "--rate must be above 0"),
    (["--slo-ttft-ms", "-5"], "--slo-ttft-ms must be above 0 ms"),
    (["--warmup", "-1"], "--warmup must be 0 or more"),
    (["--prompts", "BAD", "--tokenizer", "none"], ":1 is not valid JSON"),
    (["--prompts", "MISSING", "--tokenizer", "none"], "not found"),
])
def test_a_bad_run_option_is_one_line_and_no_request(extra, said, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    extra = [str(bad) if x == "BAD" else str(tmp_path / "missing.jsonl") if x == "MISSING" else x for x in extra]
    assert main(NOWHERE + extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err and "could not ask" not in err, err


@pytest.mark.parametrize("q", ["1.5", "99", "0"])
def test_compare_takes_a_quantile(q, tmp_path, capsys):
    assert main(["compare", str(tmp_path), str(tmp_path), "--q", q]) == 2
    assert "quantile between 0 and 1" in capsys.readouterr().err


def test_the_api_refuses_what_the_cli_refuses():
    """``num_requests=-5`` through the API read "INVALID RUN: the client was the bottleneck"."""
    with pytest.raises(ValueError, match="num_requests must be >= 1"):
        Size(num_requests=-5)
    with pytest.raises(ValueError, match="above 0 ms"):
        SLO(ttft_ms=-5)
    assert SLO(ttft_ms=500).ttft_ms == 500 and Size(num_requests=1).num_requests == 1
