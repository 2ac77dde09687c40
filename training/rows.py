"""Each training worker's rows of the train split, streamed from an exact position.

Ray Train's `get_dataset_shard` deals one stream of blocks to the workers as they arrive, and a worker cannot ask
its shard to start at row k: a run resumed mid-epoch would read (and throw away) everything the epoch had already
consumed. Here the driver lays the train split's Parquet row groups end to end in manifest order, worker r of w
takes the contiguous rows [r*M, (r+1)*M) with M = rows // w (an equal split, as Ray Train's, the remainder
dropped), and each worker streams its range through Ray Data, reading only the row groups it overlaps, in an order
drawn for each epoch (`epoch_pieces`).

That stream is cut into pools of `pool_batches(cfg)` batches. A pool's rows are shuffled with a generator seeded by
(seed, epoch, rank, pool), then cut into batches in that order or, with --length-buckets, sorted by length and cut
into batches served in a seeded order. So the batches are a function of the data and those four numbers alone,
and a resume at micro-batch b starts reading at pool b // pool_batches: it reads again at most one Parquet row
group and one pool it had consumed, and trains on none of them twice.
"""

from __future__ import annotations

import functools

import numpy as np

# The rows of a pool the shuffle mixes, in batches, when --length-buckets does not ask for more.
SHUFFLE_POOL_BATCHES = 8
# At least this many rows per read task (whole row groups): fewer, larger Ray tasks.
ROWS_PER_READ_TASK = 16384


def row_groups(paths: list[str]) -> list[tuple[str, int, int]]:
    """(path, row group, rows) of every non-empty row group of `paths`, in order, from the Parquet footers."""
    import pyarrow.parquet as pq

    groups = []
    for path in paths:
        metadata = pq.ParquetFile(path).metadata
        for index in range(metadata.num_row_groups):
            rows = metadata.row_group(index).num_rows
            if rows:
                groups.append((path, index, rows))
    return groups


def worker_rows(total_rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """Worker `rank`'s rows [start, stop) of an equal split of `total_rows` (the remainder is not trained on)."""
    share = total_rows // world_size
    return rank * share, (rank + 1) * share


def pool_batches(cfg) -> int:
    """Batches per pool: the shuffle's reach, and --length-buckets' window when that is larger."""
    return max(SHUFFLE_POOL_BATCHES, cfg.length_buckets)


def row_pieces(groups, start: int, stop: int) -> list[tuple[str, int, int, int]]:
    """(path, row group, first row, end row) within each row group that rows [start, stop) of `groups` overlap."""
    pieces, offset = [], 0
    for path, index, rows in groups:
        low, high = max(start, offset), min(stop, offset + rows)
        if low < high:
            pieces.append((path, index, low - offset, high - offset))
        offset += rows
        if offset >= stop:
            break
    return pieces


def _read_pieces(pieces):
    import pyarrow.parquet as pq

    from pipelines.shards import ShardError

    files = {}
    for path, index, low, high in pieces:
        try:
            if path not in files:
                files[path] = pq.ParquetFile(path)
            table = files[path].read_row_group(index)
        except (OSError, ValueError) as error:  # a shard damaged after tokenisation: name it, not just the codec
            raise ShardError(f"{path}: row group {index}: {error}") from error
        yield table.slice(low, high - low)


def drop_rows(pieces, count: int) -> list[tuple[str, int, int, int]]:
    """`pieces` less their first `count` rows (a piece cut part-way keeps its end)."""
    kept = []
    for path, index, low, high in pieces:
        if count >= high - low:
            count -= high - low
            continue
        kept.append((path, index, low + count, high))
        count = 0
    return kept


def _pieces_datasource():
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ParquetPiecesDatasource(Datasource):
        """Rows of Parquet row groups, (path, row group, first row, end row) each, in the order given. Each read
        task reads whole row groups and keeps the piece's rows, at least `rows_per_task` rows per task."""

        def __init__(self, pieces, rows_per_task: int = ROWS_PER_READ_TASK):
            super().__init__()
            self.pieces, self.rows_per_task = list(pieces), rows_per_task

        def estimate_inmemory_data_size(self):
            return None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            tasks, current, rows = [], [], 0
            for piece in self.pieces:
                current.append(piece)
                rows += piece[3] - piece[2]
                if rows >= self.rows_per_task:
                    tasks.append(current)
                    current, rows = [], 0
            if current:
                tasks.append(current)
            return [
                ReadTask(
                    functools.partial(_read_pieces, task),
                    BlockMetadata(
                        num_rows=sum(high - low for _, _, low, high in task),
                        size_bytes=None,
                        exec_stats=None,
                        input_files=sorted({p for p, *_ in task}),
                    ),
                    per_task_row_limit=per_task_row_limit,
                )
                for task in tasks
            ]

    return ParquetPiecesDatasource


def ordered_execution():
    """The current Ray Data execution options with `preserve_order` on."""
    import copy

    from ray.data import DataContext

    options = copy.copy(DataContext.get_current().execution_options)
    options.preserve_order = True
    return options


def read_pieces(pieces, read_cpus: float = 1.0):
    """The rows of `pieces` as a Ray Dataset that keeps their order; each read task reserves `read_cpus`."""
    import ray.data

    dataset = ray.data.read_datasource(_pieces_datasource()(pieces), num_cpus=read_cpus)
    dataset.context.execution_options = ordered_execution()
    return dataset


def epoch_pieces(groups, start: int, stop: int, seed: int, epoch: int, rank: int) -> list[tuple[str, int, int, int]]:
    """A worker's rows [start, stop) of `groups` for an epoch: its row groups in an order drawn from (seed, epoch,
    rank), so that epochs differ beyond the pools' reach."""
    pieces = row_pieces(groups, start, stop)
    order = np.random.default_rng([seed, epoch, rank, len(pieces)]).permutation(len(pieces))
    return [pieces[i] for i in order]


def cut_pool(columns: dict, batch_size: int, rng: np.random.Generator, length_key=None, group: str | None = None):
    """A pool's batches: its rows shuffled by `rng` (with `group`, a column, the groups shuffled and each group's
    rows kept together in their order: a pairwise model's triplets take a question's own negatives), then cut in
    that order, or (with `length_key(columns) -> lengths`) sorted by length, stably, so that a pairwise key keeps
    a question's rows together, cut, and served in an order drawn from `rng`. Every batch holds `batch_size` rows
    but a short last one, which stays last."""
    rows = len(next(iter(columns.values())))
    if group is None:
        order = rng.permutation(rows)
    else:
        _, member_of = np.unique(columns[group], return_inverse=True)
        member_of = member_of.reshape(-1)
        order = np.argsort(rng.permutation(member_of.max() + 1)[member_of], kind="stable")
    columns = {name: values[order] for name, values in columns.items()}
    if length_key is not None:
        by_length = np.argsort(length_key(columns), kind="stable")
        columns = {name: values[by_length] for name, values in columns.items()}
    cuts = [slice(i, i + batch_size) for i in range(0, rows, batch_size)]
    full = len(cuts) - (rows % batch_size != 0)
    served = list(rng.permutation(full)) if length_key is not None else list(range(full))
    for k in served + list(range(full, len(cuts))):
        yield {name: values[cuts[k]] for name, values in columns.items()}


def epoch_batches(
    groups,
    start: int,
    stop: int,
    cfg,
    epoch: int,
    rank: int,
    length_key=None,
    skip: int = 0,
    group: str | None = None,
    read_cpus: float = 1.0,
):
    """(index, numpy batch) of an epoch over rows [start, stop) of `groups`, from micro-batch `skip` on: the row
    groups in the epoch's order (`epoch_pieces`), then pools of `pool_batches(cfg)` batches through `cut_pool`
    (length-bucketed when --length-buckets is above 1; `group` rows kept together). Reading starts at the pool
    holding batch `skip`; its read tasks reserve `read_cpus` each."""
    per_pool = pool_batches(cfg)
    first_pool = skip // per_pool
    pieces = drop_rows(epoch_pieces(groups, start, stop, cfg.seed, epoch, rank), first_pool * per_pool * cfg.batch_size)
    if not pieces:
        return
    key = length_key if cfg.length_buckets > 1 else None
    pools = read_pieces(pieces, read_cpus).iter_batches(batch_size=per_pool * cfg.batch_size, batch_format="numpy")
    for number, pool in enumerate(pools, start=first_pool):
        rng = np.random.default_rng([cfg.seed, epoch, rank, number])
        for k, batch in enumerate(cut_pool(pool, cfg.batch_size, rng, key, group)):
            index = number * per_pool + k
            if index >= skip:
                yield index, batch
