"""Percentiles and the p50/p99 markdown table shared by the SDK latency benches
(hack/bench.d/e2b_latency.py, hack/bench.d/osb_latency.py; imported from this directory).
"""


def pct(xs, p):
    """The p-th percentile of xs (nearest rank, rounded)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def print_table(title, steps):
    """A markdown table of p50/p99 per step (milliseconds)."""
    print(f"| {title} | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for k, xs in steps.items():
        print(f"| {k} | {pct(xs, 50):.1f} | {pct(xs, 99):.1f} |")
