"""Compare time per record as the record count grows: a narrow GPT at many layers, bf16 autocast vs fp32.

    python bench/scale.py [--layers 4,64,256] [--warmup N] [--repeat 1] [--no-html]

For each layer count L: a GPT of width 32, sequence 16, vocabulary 64 (the example's -inf causal
mask), batch 2, whose records grow like a deep model's while its compute stays small. One AdamW
step is dumped as statistics twice, fp32 and bf16 autocast, after ``--warmup`` plain steps (0: the
first step, where freshly initialised tensors share their statistics: zero biases, LayerNorm
weights of ones, zero optimizer state). ``torchdebug.compare(a, b)`` is then timed in-process.
Each L runs in its own process so that its peak RSS (``resource.getrusage``) is its own. Prints
records, seconds (best of the repeats), µs per record, peak RSS and the µs-per-record ratio to the
first L. Then, unless ``--no-html``, the HTML report: seconds to write it, its bytes per row, and
the seconds headless Chromium takes from navigation to the table's first page drawn (the page's
``rows-ready`` mark; the faster of two loads; needs the test extra's selenium and Debian's chromium,
see ``tests/report/browser.py``). Dumps live in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
import torchdebug.compare  # noqa: E402,F401  (imported before the timed compare)
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402


def dump(path: Path, layers: int, warmup: int, bf16: bool) -> Path:
    """The narrow GPT's AdamW step after ``warmup`` plain ones, dumped as statistics at ``path``."""
    torchdebug.seed_all(1234)
    model = GPT(GPTConfig(n_layer=layers, d_model=32, n_head=4, seq_len=16, vocab=64))
    optimizer = torch.optim.AdamW(model.parameters())
    batch = make_batch(model.config, batch=2)
    autocast = torch.bfloat16 if bf16 else None
    for _ in range(warmup):
        train_step(model, optimizer, batch, autocast=autocast)
    with torchdebug.dump(path, model=model, task="statistics"):
        train_step(model, optimizer, batch, autocast=autocast)
    return path


def page(result: torchdebug.CompareResult, path: Path) -> dict[str, float]:
    """Write ``result``'s HTML report at ``path``: seconds to write, bytes, and seconds to open (or NaN)."""
    from tests.report.browser import browser, missing, open_compare_page

    start = time.perf_counter()
    result.to_html(path)
    written = time.perf_counter() - start
    opened = float("nan")
    if missing() is None:
        with browser() as driver:
            opened = min(open_compare_page(driver, path.as_uri()) for _ in range(2))
    return {"html_seconds": written, "html_bytes": path.stat().st_size, "open_seconds": opened}


def measure(layers: int, warmup: int, repeat: int, html: bool) -> dict[str, float]:
    """Build the pair for ``layers`` and time its compare (this process's peak RSS included), then its page."""
    with tempfile.TemporaryDirectory() as temp:
        a = dump(Path(temp) / "bf16", layers, warmup, bf16=True)
        b = dump(Path(temp) / "fp32", layers, warmup, bf16=False)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            result = torchdebug.compare(a, b)
            times.append(time.perf_counter() - start)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        report = page(result, Path(temp) / "compare.html") if html else {}
    return {
        "layers": layers,
        "records": len(result.rows),
        "seconds": min(times),
        "rss_mb": rss_mb,
        "counts": result.counts(),
        **report,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="4,64,256", help="layer counts, comma-separated (default 4,64,256)")
    parser.add_argument("--warmup", type=int, default=0, help="plain steps before the dumped one (default 0)")
    parser.add_argument("--repeat", type=int, default=1, help="timed compares per L (best reported)")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML report (its size and load time)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one L, JSON out
    args = parser.parse_args()
    counts = [int(part) for part in args.layers.split(",")]
    if args.one:
        print(json.dumps(measure(counts[0], args.warmup, args.repeat, not args.no_html)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, warm-up steps {args.warmup}")
    first = None
    for layers in counts:
        child = [sys.executable, __file__, "--one", "--layers", str(layers), "--warmup", str(args.warmup)]
        child += ["--no-html"] if args.no_html else []
        out = subprocess.run([*child, "--repeat", str(args.repeat)], check=True, capture_output=True, text=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        per_record = row["seconds"] / row["records"] * 1e6
        first = first or per_record
        print(
            f"layers {layers:4d}  records {row['records']:8,d}  compare {row['seconds']:8.2f} s  {per_record:6.1f} µs/record"
            f"  x{per_record / first:4.2f}  peak RSS {row['rss_mb']:6.0f} MB  load {os.getloadavg()[0]:.2f}"
            f"  verdicts {row['counts']}"
        )
        if "html_bytes" in row:
            print(
                f"            html: written in {row['html_seconds']:.2f} s, {row['html_bytes'] / 1e6:.2f} MB"
                f" ({row['html_bytes'] / row['records']:.1f} B/row), opens in {row['open_seconds']:.2f} s"
            )


if __name__ == "__main__":
    main()
