"""What a run shows: its progress lines (one write each, never doubled by Ray's print patching), TensorBoard
scalars, and the training-curve PNG."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from typing import TYPE_CHECKING

from training.checkpoints import publish, run_dir

if TYPE_CHECKING:
    from training.config import TrainConfig


def log(message: str) -> None:
    # Not print(): inside a Ray Train worker, print is patched to log through the root logger (whose console
    # handler writes the line) and, because Ray wraps sys.stderr, also to call the original print, so every
    # line reached the driver twice. A direct write goes out once. stdout is kept for the job's final JSON line.
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class Scalars:
    """Training and dev scalars as TensorBoard event files under RUN/tensorboard (rank 0 only). On local and
    shared storage the events are written in place; on object storage to a local folder uploaded at every
    checkpoint. A resumed run purges what a lost attempt wrote after the step it resumes from."""

    def __init__(self, cfg: TrainConfig, resume_step: int):
        from tensorboardX import SummaryWriter

        self.destination = run_dir(cfg) + "/tensorboard"
        self.remote = "://" in self.destination
        directory = tempfile.mkdtemp(prefix="tensorboard-") if self.remote else self.destination
        self.writer = SummaryWriter(directory, purge_step=resume_step or None, flush_secs=30)
        self.directory = directory

    def add(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()
        if self.remote:
            publish(self.directory, self.destination)

    def close(self) -> None:
        self.flush()
        self.writer.close()


def plot_curves(curve: list, dev_history: list, metric: str, path: str, title: str) -> None:
    """Training loss and the dev metric against the step, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, loss_axis = plt.subplots(figsize=(7, 4))
    if curve:
        loss_axis.plot([s for s, _ in curve], [loss for _, loss in curve], color="tab:blue", label="train loss")
    loss_axis.set_xlabel("optimiser step")
    loss_axis.set_ylabel("train loss", color="tab:blue")
    if dev_history:
        dev_axis = loss_axis.twinx()
        steps = [step for step, _ in dev_history]
        dev_axis.plot(steps, [m.get(metric, float("nan")) for _, m in dev_history], "o-", color="tab:orange")
        dev_axis.set_ylabel(f"dev {metric}", color="tab:orange")
    loss_axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def worker_log_level(level: str) -> None:
    """Ray Train's per-report line ("Reporting training result N: TrainingReport(...)") comes from a logger named
    by its file's path, outside the `ray.train` loggers that RunConfig's LoggingConfig sets: set it here too.
    A quiet run (WARNING) also keeps Ray Train's "Error in training function" traceback off the console: the job
    ends with one line naming the cause, and writes that traceback to the log file the line names."""
    import logging

    with contextlib.suppress(ImportError):
        from ray.train.v2._internal.execution import context as train_context

        logging.getLogger(train_context.__file__).setLevel(level)
    if logging.getLevelName(level) >= logging.WARNING:
        logging.getLogger("ray.train.v2._internal.util").setLevel(logging.CRITICAL)


def figure_cells(figures: dict, names=None, digits: int = 3) -> list[str]:
    """`MAP 0.721`-style cells of evaluation figures: those named (in that order), by default every figure but the
    counts; a figure that is missing or not a number is left out."""
    names = [n for n in figures if n not in ("questions", "skipped")] if names is None else names
    return [
        f"{name.upper()} {figures[name]:.{digits}f}" for name in names if isinstance(figures.get(name), (int, float))
    ]


def figures_line(metrics: dict) -> str:
    """Evaluation figures for a person: `MAP 0.721 MRR 0.765 P@1 0.589 (56 questions)`."""
    count = f" ({metrics['questions']:,} questions)" if "questions" in metrics else ""
    return " ".join(figure_cells(metrics)) + count


def write_profile_tables(profiler, path: str, header: str, cuda: bool) -> None:
    """A finished torch.profiler's operators by host time and, on a GPU, by device time, as text at `path`."""
    import os

    table = profiler.key_averages()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(header + "\n\n" + table.table(sort_by="self_cpu_time_total", row_limit=40) + "\n\n")
        if cuda:
            f.write(table.table(sort_by="self_cuda_time_total", row_limit=25) + "\n")
