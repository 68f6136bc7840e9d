"""How compact and how fast a dump's records are: bytes on disk, encoding, loading as Arrow and as records.

    python bench/store.py [--layers 64] [--records 1000000]

Dumps one AdamW step of the narrow GPT of ``bench/scale.py`` (width 32, sequence 16, vocabulary 64,
batch 2, bf16 autocast, statistics, step 0) at ``--layers`` layers, then reports, for that dump:
bytes per record of its records file and of its rank folder (stacks and manifest included); the
capturing thread's time per record to make a batch's columns (``records_batch``, batches of 2048
as a step writes them); then writes its records again and again through ``RankWriter`` until
``--records`` are on disk, and times ``to_arrow()`` of that rank and ``records()`` (best of 3, the
cyclic collector as it is) with the memory the records hold (``tracemalloc``, per record). Times
are wall-clock, then the process's CPU time (all threads) in parentheses; on a shared machine note
the load.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torchdebug  # noqa: E402
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from torchdebug.store import _layout as layout  # noqa: E402
from torchdebug.store._reader import RankDump  # noqa: E402
from torchdebug.store._record_columns import records_batch  # noqa: E402
from torchdebug.store._writer import RankWriter, create_run_dir  # noqa: E402

BATCH = 2048


def narrow_gpt_dump(folder: Path, layers: int) -> RankDump:
    """One bf16 statistics step of the narrow GPT at ``layers`` layers, dumped under ``folder``."""
    config = GPTConfig(n_layer=layers, d_model=32, n_head=4, seq_len=16, vocab=64)
    torchdebug.seed_all(1234)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters())
    batch = make_batch(config, batch=2)
    with torchdebug.dump(folder, model=model, task="statistics"):
        train_step(model, optimizer, batch, autocast=torch.bfloat16)
    return torchdebug.load(folder).ranks[0]


def best(work, repeat: int = 3) -> tuple[float, float]:
    """Best wall-clock seconds and best CPU seconds (all the process's threads) of ``repeat`` runs of ``work``."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        work()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu)


def write_many(records: list, folder: Path, total: int) -> Path:
    """Write ``records`` again and again, in batches of 2048, until ``total`` are in one rank folder."""
    writer = RankWriter(create_run_dir(folder, "many") / layout.rank_dir_name(1, 0), {"rank": 0, "world_size": 1})
    written = 0
    while written < total:
        for start in range(0, len(records), BATCH):
            part = records[start : min(start + BATCH, start + total - written)]
            writer.submit(0, part, None, [])
            written += len(part)
            if written >= total:
                break
    writer.close()
    return writer.rank_dir


def measure_dump(dump: RankDump, layers: int) -> list:
    """Print the dump's bytes per record and the time to make its batches' columns; its records."""
    records = dump.records()
    count = len(records)
    on_disk = (dump.path / layout.RECORDS).stat().st_size / count
    folder = sum(file.stat().st_size for file in dump.path.iterdir() if file.is_file()) / count
    print(f"narrow GPT, {layers} layers: {count} records, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  on disk: {on_disk:.1f} B/record, rank folder {folder:.1f} B/record")
    seconds, cpu = best(lambda: [records_batch(records[i : i + BATCH]) for i in range(0, count, BATCH)])
    print(f"  columns of a batch (capturing thread): {seconds / count * 1e6:.2f} us/record ({cpu / count * 1e6:.2f} CPU)")
    return records


def measure_loading(rank_dir: Path) -> None:
    """Print the time to load a rank's records as an Arrow table and as records, and their memory."""
    count = RankDump.open(rank_dir).to_arrow().num_rows
    size = (rank_dir / layout.RECORDS).stat().st_size
    seconds, cpu = best(RankDump.open(rank_dir).to_arrow)
    print(f"  {count} records ({size / 2**20:.1f} MiB, {size / count:.1f} B/record): to_arrow {seconds:.2f} s ({cpu:.2f} s CPU)")
    seconds, cpu = best(lambda: RankDump.open(rank_dir).records())
    print(f"  records(): {seconds:.2f} s, {seconds / count * 1e6:.2f} us/record ({cpu / count * 1e6:.2f} CPU)")
    gc.collect()
    tracemalloc.start()
    kept = RankDump.open(rank_dir).records()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"  memory the records hold: {held / len(kept):.0f} B/record")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=64, help="layers of the narrow GPT (default 64)")
    parser.add_argument("--records", type=int, default=1_000_000, help="records of the loading test (default 1,000,000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        records = measure_dump(narrow_gpt_dump(Path(tmp) / "dump", args.layers), args.layers)
        rank_dir = write_many(records, Path(tmp), args.records)
        del records
        measure_loading(rank_dir)


if __name__ == "__main__":
    main()
