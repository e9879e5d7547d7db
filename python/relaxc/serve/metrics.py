"""What an LLM engine has done, in Prometheus's text exposition format (GET /metrics), named as
vLLM's and llama.cpp's servers name theirs where they agree: requests running and waiting, prompt
and generated tokens, time to first token and per output token as histograms, KV cache pages in
use. The engine thread records; the server thread renders a snapshot (plain ints and lists under
the GIL, so a render never sees a histogram half updated beyond one observation)."""

import math

# Seconds; the last bucket is +Inf.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    """Cumulative buckets of observations, their sum and count."""

    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value):
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value

    def lines(self, name, labels):
        total = 0
        out = []
        for bound, count in zip([*self.bounds, math.inf], self.counts):
            total += count
            le = "+Inf" if bound == math.inf else repr(float(bound))
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {total}")
        return out


class Metrics:
    """Counters and histograms of one engine."""

    def __init__(self):
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)

    def render(self, model, running, waiting, pages_used, pages_total):
        """The exposition text, every series labelled with the model's name."""
        labels = f'model_name="{_escape(model)}"'
        lines = []

        def metric(name, kind, help_text, samples):
            lines.append(f"# HELP relaxc:{name} {help_text}")
            lines.append(f"# TYPE relaxc:{name} {kind}")
            lines.extend(samples)

        def one(name, value, extra=""):
            return f"relaxc:{name}{{{labels}{extra}}} {value}"

        metric(
            "num_requests_running", "gauge", "Sequences in the running batch.", [one("num_requests_running", running)]
        )
        metric("num_requests_waiting", "gauge", "Sequences queued for a place.", [one("num_requests_waiting", waiting)])
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled.",
            [one("prompt_tokens_total", self.prompt_tokens)],
        )
        metric(
            "generation_tokens_total",
            "counter",
            "Tokens generated.",
            [one("generation_tokens_total", self.generation_tokens)],
        )
        metric(
            "request_finished_total",
            "counter",
            "Sequences finished, by why: stop (a stop token or string), length, abort (client gone), error.",
            [one("request_finished_total", n, f',finished_reason="{r}"') for r, n in self.finished.items()],
        )
        metric(
            "time_to_first_token_seconds",
            "histogram",
            "From a sequence's arrival to its first token.",
            self.ttft.lines("relaxc:time_to_first_token_seconds", labels),
        )
        metric(
            "time_per_output_token_seconds",
            "histogram",
            "Between a sequence's consecutive tokens.",
            self.tpot.lines("relaxc:time_per_output_token_seconds", labels),
        )
        metric(
            "kv_cache_pages_used", "gauge", "KV cache pages holding tokens.", [one("kv_cache_pages_used", pages_used)]
        )
        metric("kv_cache_pages_total", "gauge", "KV cache pages in all.", [one("kv_cache_pages_total", pages_total)])
        usage = pages_used / pages_total if pages_total else 0.0
        metric(
            "kv_cache_usage_ratio",
            "gauge",
            "Share of the KV cache's pages in use.",
            [one("kv_cache_usage_ratio", usage)],
        )
        return "\n".join(lines) + "\n"


def _escape(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
