"""A benchmark's current run, published into the book: its JSON (docs/src/benchmarks/data/NAME.json),
its plot (docs/src/benchmarks/NAME.svg) and the run's block on its page (docs/src/benchmarks/NAME.md,
between the `<!-- run -->` and `<!-- /run -->` markers): the machine, the date, the commit, the
versions, the tables and the plot. A bench script calls publish() when run with --publish, so
exploratory runs leave the book alone.

The plot shows speed ratios, relaxc's speed over the peer's (above 1: relaxc is faster), one
group of bars per row of the benchmark, one bar per series (threads, prompt length).

`python3 bench/report.py NAME` redraws NAME's plot and block from its JSON alone."""

import datetime
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = os.path.join(ROOT, "docs", "src", "benchmarks")
BEGIN, END = "<!-- run -->", "<!-- /run -->"
# The instruction-set extensions that decide which kernels run, as /proc/cpuinfo names them.
ISA_FLAGS = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8", "asimddp"]


def threads(n):
    """A plot series' name for a thread count: "1 thread", "2 threads"."""
    return f"{n} thread{'s' if n > 1 else ''}"


def machine():
    """This machine in one line: the CPU's model name (and family/model on x86), its cores and
    the extensions that decide the kernels, and whether it is a VM."""
    fields, flags = {}, set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model", "vendor_id") and key not in fields:
                    fields[key] = value.strip()
                if key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']} model {fields.get('model', '?')})"
    isa = [f for f in ISA_FLAGS if f in flags]
    virtual = ", a VM" if "hypervisor" in flags else ""
    return f"{name}, {os.cpu_count()} cores{virtual}; {' '.join(isa) or 'no SIMD extensions listed'}"


def commit():
    """HEAD's short hash, and the tracked files that differ from it, if any (a run is of the tree
    as it was, so the page says which files were not yet committed)."""
    out = subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--name-only", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    changed = dirty.stdout.split()
    if not changed:
        return out.stdout.strip()
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return f"{out.stdout.strip()} (uncommitted changes to {shown})"


def versions(*packages):
    """'name version' for each Python package that is installed."""
    from importlib import metadata

    found = []
    for package in packages:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return found


def plot(path, title, bars, ylabel):
    """bars: {row label: {series: ratio}} as grouped bars, with a line at 1."""
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams["svg.hashsalt"] = "relaxc"  # the same plot gives the same file
    import matplotlib.pyplot as plt

    labels = list(bars)
    series = list(dict.fromkeys(s for row in bars.values() for s in row))  # in first-seen order
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) * max(1, len(series)) / 2 + 2), 3.8))
    for i, s in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ys = [bars[label].get(s, 0) for label in labels]
        drawn = ax.bar(xs, ys, width, label=s)
        ax.bar_label(drawn, labels=[f"{y:.2f}" if y else "" for y in ys], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_ylim(0, max(1.2, max((v for row in bars.values() for v in row.values()), default=1) * 1.15))
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)


def render(name, run):
    """The page's run block from a run's JSON."""
    lines = [
        BEGIN,
        f"Run of {run['date']} on commit {run['commit']}.",
        "",
        f"Machine: {run['machine']}.",
        "",
        f"Versions: {', '.join(run['versions'])}." if run["versions"] else "",
        "",
        f"![{run['title']}]({name}.svg)",
        "",
    ]
    for table in run["tables"]:
        lines += table + [""]
    lines.append(END)
    return "\n".join(lines)


def write_page(name, run):
    page = os.path.join(PAGES, f"{name}.md")
    text = open(page, encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        sys.exit(f"{page} has no {BEGIN} ... {END} block to fill")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    with open(page, "w", encoding="utf-8") as out:
        out.write(before + render(name, run) + after)
    plot(os.path.join(PAGES, f"{name}.svg"), run["title"], run["bars"], run["ylabel"])
    return page


def publish(name, title, tables, bars, ylabel, packages=(), extra=None):
    """Records a run of benchmark NAME and fills its page: tables are lists of Markdown lines
    (a caption line may come first), bars as plot() takes them, packages the Python packages whose
    versions matter, extra anything else the JSON should keep (raw medians, checks)."""
    run = {
        "name": name,
        "title": title,
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "machine": machine(),
        "versions": [f"Python {platform.python_version()}"] + versions(*packages),
        "tables": tables,
        "bars": bars,
        "ylabel": ylabel,
        "extra": extra or {},
    }
    os.makedirs(os.path.join(PAGES, "data"), exist_ok=True)
    with open(os.path.join(PAGES, "data", f"{name}.json"), "w") as out:
        json.dump(run, out, indent=1)
        out.write("\n")
    page = write_page(name, run)
    print(f"published to {os.path.relpath(page, ROOT)} and its plot")


def main():
    if len(sys.argv) != 2 or not re.fullmatch(r"[a-z0-9-]+", sys.argv[1]):
        sys.exit("usage: python3 bench/report.py NAME   (redraws docs/src/benchmarks/NAME.md's run from its JSON)")
    with open(os.path.join(PAGES, "data", f"{sys.argv[1]}.json")) as f:
        run = json.load(f)
    write_page(sys.argv[1], run)


if __name__ == "__main__":
    main()
