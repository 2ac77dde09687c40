"""The per-worker training loop that Ray Train runs on every worker (training/trainer.py starts it).

Models stay plain PyTorch (`qa_models`); this module feeds them Parquet shards through Ray Data and trains
them with their paper's recipe (qa_models/recipes.py, applied by training/optim.py: optimiser, learning-rate
schedule, coupled L2, a moving average of the weights), with gradient accumulation and autocast (bf16, or fp16
with a gradient scaler), reports dev MAP/MRR/P@1 (with the averaged weights where the recipe keeps them), stops
after --patience evaluations without a new best, and checkpoints model, optimiser, scheduler, scaler, weight
average, step, data position and the dev history. Each worker streams its own rows
of train from an exact position (training/rows.py), in batches fixed by the data and the seed, and every random
draw is seeded by position (`seed_micro_batch`), so a run restarted from a checkpoint, after a lost worker or
node, reads on from where it was, without re-reading what it had consumed, and ends with the weights of an
uninterrupted one. Ray Train keeps the best checkpoints by a dev metric and the latest. A run is resumed by
running again with the same storage path and name (Ray Train V2 finds the latest checkpoint; a damaged one is
passed over for the newest intact one before it). Rank 0 also checkpoints every --checkpoint-minutes, and when the
driver has received SIGINT or SIGTERM, after which every worker stops. Scalars go to
TensorBoard event files and the curves to a PNG in the run folder.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from runtime.allocator import reuse_large_blocks
from runtime.stop import StopWatch
from training.checkpoints import (
    SCORE,
    STATE_FILE,
    VOCAB_FILE,
    load_pretrained,
    load_state_file,
    predictions_name,
    select_score,
    usable_checkpoint,
    write_checkpoint,
    write_jsonl,
)
from training.config import TrainConfig, autocast_dtype, precision_name
from training.data import Batcher, pinned, prefetched, to_device
from training.evaluation import best_so_far, evaluate, evaluations_since_best, score_split
from training.models import build_model, training_forward
from training.optim import WeightAverage, build_optimizer, l2_penalty, lr_factor
from training.progress import Scalars, figures_line, log, worker_log_level, write_profile_tables
from training.rows import epoch_batches, worker_rows


def _all_reduce_gradients(model) -> None:
    """Average gradients over the workers by hand, for backward passes run under DDP's `no_sync`."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad.div_(dist.get_world_size())


def seed_micro_batch(seed: int, rank: int, epoch: int, index: int) -> None:
    """Seed torch, numpy and random from (seed, rank, epoch, micro-batch): dropout masks and any other draw are
    a function of where the run is, not of the draws before, so a run restarted from a checkpoint (on another
    node, with other ranks) makes exactly the draws the uninterrupted run made and no RNG state need be saved."""
    state = np.random.SeedSequence([seed, rank, epoch, index]).generate_state(2)
    torch.manual_seed(int(state[0]))
    np.random.seed(int(state[1]))
    random.seed(int(state[1]))


def _agree(flag: bool, device) -> bool:
    """Rank 0's `flag` on every worker (a decision only rank 0 can take, such as stopping on its dev figures)."""
    return bool(_rank_zero_code(int(flag), device))


def _rank_zero_code(code: int, device) -> int:
    """Rank 0's `code` on every worker (what to do after this step: see WorkerRun.after_step_action)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return code
    value = torch.tensor([code], dtype=torch.int64, device=device)
    dist.broadcast(value, src=0)
    return int(value.item())


PROFILE_STEPS = 20  # the last steps of a run QA_PROFILE records

# What every worker does after an optimiser step, decided by rank 0: STOP + i stops on SIGNALS[i].
GO_ON, CHECKPOINT, STOP = 0, 1, 2
SIGNALS = ("SIGINT", "SIGTERM")


def train_loop_per_worker(config: dict) -> None:
    """What Ray Train runs on every worker: `config` is the driver's (training/trainer.py)."""
    WorkerRun(config).train()


class WorkerRun:
    """One worker's part of a training run: built, or restored from the run's latest checkpoint, then trained
    epoch by epoch, a step at a time; rank 0 evaluates on dev, logs, and writes the checkpoints."""

    def __init__(self, config: dict):
        import ray.train
        import ray.train.torch

        worker_log_level(config.get("log_level", "INFO"))
        # Each step frees and allocates the same big activations: glibc's defaults would map and page-fault them
        # afresh every step (on CPU, CTRN's step at L = 400 1.7-2.1x slower; runtime/allocator.py)
        reuse_large_blocks()
        self.config = config
        self.cfg = cfg = TrainConfig(**config["train"])
        self.total_steps, self.vocab_size = config["total_steps"], config["vocab_size"]
        self.batches_per_epoch = config["batches_per_epoch"]  # this worker's, of an equal split
        self.metric = config["select_metric"]
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)

        vectors = np.load(config["embeddings"]) if config["embeddings"] else None
        model = build_model(cfg, self.vocab_size, vectors, config["from_data"], config["pretrained_config"])
        del vectors
        self.device = ray.train.torch.get_device()
        model.to(self.device)  # before the optimiser: on a GPU its Adam steps are fused kernels (build_optimizer)
        self.optimizer = build_optimizer(cfg, model, cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(cfg.schedule, self.total_steps, cfg.warmup, cfg.warmup_steps)
        )
        self.dtype = autocast_dtype(cfg.precision, self.device)
        # A gradient scaler only matters for fp16 (bf16 has fp32's range); disabled, it is a pass-through.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.step, self.epoch, self.batch_in_epoch, self.resumed_from = 0, 0, 0, 0
        self.curve: list[list] = []  # [step, loss]
        # [step, wall-clock time] at each progress line of this run, taken after the line's read of the losses
        # waited for the GPU: the rate between two of them is what the device did (a benchmark's steady state)
        self.progress_times: list[list] = []
        self.dev_history: list[list] = []  # [step, dev figures]
        self.stopped_early = False
        self.trained_before = 0.0  # seconds trained before the latest resume, up to the checkpoint it resumed from
        self.interrupted: str | None = None  # the signal that stopped the run, once its checkpoint is saved
        averaged_state = self.restore(model, ray.train.get_checkpoint())
        self.stop_watch = StopWatch(config.get("stop_key")) if self.rank == 0 else None
        self.last_saved = time.time()

        self.segment_started = time.time()
        # DDP's wrapper with more than one worker. A pretrained transformer holds weights no loss reaches (BERT's
        # pooler: the models read token states); DDP must be told to expect them, or it stops at the second step.
        unused = {"find_unused_parameters": True} if cfg.encoder_path else None
        self.model: Any = ray.train.torch.prepare_model(model, parallel_strategy_kwargs=unused)
        # the model itself under DDP's wrapper: registered models differ, so what the loop reads of it is untyped
        self.core: Any = getattr(self.model, "module", self.model)
        self.train_forward: Any = training_forward(self.model, cfg.compile)  # --compile's, or the model
        self.average = WeightAverage(self.core, cfg.ema_decay) if cfg.ema_decay else None
        if self.average is not None and averaged_state is not None:
            self.average.load_state_dict(averaged_state)
        self.batcher = Batcher(
            cfg,
            self.core.inputs,
            getattr(self.core, "objective", None),
            getattr(self.core.config, "max_len", None),
            config["max_context"],
        )
        self.first_row, self.end_row = worker_rows(config["train_rows"], self.world_size, self.rank)
        self.scalars: Scalars | None = Scalars(cfg, self.resumed_from) if self.rank == 0 else None
        self.last_loss: float | torch.Tensor = 0.0
        # QA_TRACE_ROWS=DIR: every worker writes (epoch, micro-batch, qid, aid) of each row it trains on to
        # DIR/NAME/rank-N.tsv (appending, so a resumed run adds its rows): what shows that workers partition epochs
        trace = os.environ.get("QA_TRACE_ROWS")
        self.trace = os.path.join(trace, cfg.name, f"rank-{self.rank}.tsv") if trace else None
        if self.trace:
            os.makedirs(os.path.dirname(self.trace), exist_ok=True)
        # QA_PROFILE=DIR: rank 0 runs the last PROFILE_STEPS steps under torch.profiler and writes the host's and
        # the device's time by operator to DIR/NAME-rank-0.txt (what a GPU that is not busy waits for)
        profile = os.environ.get("QA_PROFILE")
        self.profile_to = os.path.join(profile, f"{cfg.name}-rank-0.txt") if profile and self.rank == 0 else None
        self.profiler: Any = None
        self.window: int = 0  # steps since the last progress line
        self.window_loss: float | torch.Tensor = 0.0  # their summed loss (on the device until a line reads it)
        self.evaluated_at: int | None = None
        self.last_dev: dict = {}
        self.started, self.first_step = time.time(), self.step
        self.warm: tuple[int, float] | None = None

    @property
    def examples_per_step(self) -> int:
        return self.cfg.batch_size * self.cfg.grad_accumulation * self.cfg.num_workers

    def restore(self, model, checkpoint) -> dict | None:
        """Where the run is: a resumed run's state from its latest checkpoint (returning its weight average), or
        a fresh run's starting weights (--init-from) and the word statistics some models read."""
        if checkpoint:
            import ray.train

            path = checkpoint.path
            if path.rstrip("/") == (self.config.get("damaged_latest") or "").rstrip("/"):
                path = self.config["resume_from"]  # the driver found the latest damaged and said so
            else:  # verified here too: after a worker-group restart the latest is one this run just wrote
                path = usable_checkpoint(path, log if self.rank == 0 else None)
            with ray.train.Checkpoint(path).as_directory() as directory:
                state = load_state_file(os.path.join(directory, STATE_FILE))
            model.load_state_dict(state["model"])
            self.stopped_early = state.get("stopped_early", False)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            self.step, self.epoch = state["step"], state["epoch"]
            self.batch_in_epoch, self.curve = state["batch_in_epoch"], state["curve"]
            self.dev_history = state.get("dev_history", [])
            self.trained_before = state.get("trained_seconds", 0.0)
            self.resumed_from = self.step
            if self.rank == 0:
                log(f"[train] resumed from step {self.step} (epoch {self.epoch}, batch {self.batch_in_epoch})")
            return state.get("weight_average")
        if self.config["init_from"]:  # a fresh fine-tuning run; a resumed one continues from its own checkpoint
            load_pretrained(model, self.config["init_from"])
            if self.rank == 0:
                # which checkpoint of the --init-from run, and why: its best by dev, or its latest if none ranked
                chosen = self.config.get("init_chosen")
                log(f"[train] starting from the weights of {self.config['init_from']}{': ' + chosen if chosen else ''}")
        if getattr(model, "needs_word_statistics", False):  # from this run's train split, saved with the weights
            from training.word_statistics import word_statistics

            files = list(dict.fromkeys(path for path, *_ in self.config["train_row_groups"]))
            model.load_word_statistics(*word_statistics(files, self.config["vocab_path"]))
        return None

    # ------------------------------------------------------------------------------------------ the run
    def train(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        while self.step < self.total_steps and not self.stopped_early:
            if not self.train_epoch():
                break
        if not self.interrupted:
            self.finish()

    def train_epoch(self) -> bool:
        """This worker's rows of the current epoch, from where the run is (a resume skips the micro-batches the
        epoch had consumed); False where the run ends inside it (its last step, or an early stop)."""
        cfg = self.cfg
        micro = 0
        step_loss: float | torch.Tensor = 0.0  # a tensor on the device once a micro-batch's loss is added
        batches = epoch_batches(
            self.config["train_row_groups"],
            self.first_row,
            self.end_row,
            cfg,
            self.epoch,
            self.rank,
            self.batcher.length_key,
            self.batch_in_epoch,
            "qid" if self.batcher.pairwise else None,
            self.config["read_cpus"],
        )
        with contextlib.closing(prefetched(batches, self.prepare)) as prepared:
            for index, batch, inputs, labels in prepared:
                micro += 1
                last_micro = micro == cfg.grad_accumulation or index + 1 == self.batches_per_epoch
                step_loss = step_loss + self.micro_batch(index, batch, inputs, labels, last_micro)
                self.batch_in_epoch = index + 1
                if not last_micro:
                    continue
                self.optimiser_step(micro)
                self.after_step(step_loss / micro)
                micro, step_loss = 0, 0.0
                if not self.after_step_checks():
                    return False
        if micro:  # the shard held more batches than expected: their gradients were never all-reduced
            _all_reduce_gradients(self.model)
            self.optimiser_step(micro)
            self.step += 1
            self.window += 1
            self.window_loss = self.window_loss + step_loss / micro
        self.epoch += 1
        self.batch_in_epoch = 0
        if self.step < self.total_steps:
            if self.evaluated_at != self.step:
                self.last_dev, self.evaluated_at = self.dev_metrics(), self.step
            if not self.stop_now():
                self.save({"dev": self.last_dev})
        return True

    def after_step_checks(self) -> bool:
        """After an optimiser step: the last step, a dev evaluation (which may stop the run early), a checkpoint,
        or rank 0's stop request; False where the run ends here."""
        cfg = self.cfg
        if self.step >= self.total_steps:
            return False
        saved = True
        if cfg.eval_every and self.step % cfg.eval_every == 0:
            self.last_dev, self.evaluated_at = self.dev_metrics(), self.step
            if self.stop_now():  # the final checkpoint is this step's
                return False
            self.save({"dev": self.last_dev})
        elif cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self.save({"loss": float(self.last_loss)})
        else:
            saved = False
        action = _rank_zero_code(self.after_step_action(), self.device)
        if action == CHECKPOINT and not saved:
            self.save({"loss": float(self.last_loss)})
        elif action >= STOP:
            self.interrupted = SIGNALS[action - STOP]
            if not saved:
                self.save({"loss": float(self.last_loss), "interrupted": self.interrupted})
            if self.rank == 0:
                log(
                    f"[train] step {self.step}: checkpoint saved after {self.interrupted}; run the same command "
                    "to resume"
                )
            return False
        return True

    def prepare(self, item: tuple[int, dict]) -> tuple[int, dict, dict, Any]:
        """A micro-batch's model inputs and labels from its rows (in the prefetch thread: Batcher's draws are
        seeded by the batch itself, not by the global generators that `seed_micro_batch` sets), pinned for a GPU."""
        index, batch = item
        inputs, labels = self.batcher(batch, train=True)
        if self.device.type == "cuda":
            inputs, labels = pinned(inputs), pinned(labels)
        return index, batch, inputs, labels

    def micro_batch(self, index: int, batch: dict, inputs: dict, labels: Any, last_micro: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch, its draws seeded by position; its loss, left on the device (a
        read would wait for the GPU every step: the host could not build the next batch while the GPU works)."""
        cfg, device = self.cfg, self.device
        seed_micro_batch(cfg.seed, self.rank, self.epoch, index)
        if self.trace is not None:
            answers = batch.get("aid", ["-"] * len(batch["qid"]))
            with open(self.trace, "a") as f:
                f.write("".join(f"{self.epoch}\t{index}\t{q}\t{a}\n" for q, a in zip(batch["qid"], answers)))
        # DDP all-reduces gradients on every backward; between optimiser steps there is nothing to share.
        sync = contextlib.nullcontext() if last_micro or not hasattr(self.model, "no_sync") else self.model.no_sync()
        with sync:
            with torch.autocast(device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
                logits = self.train_forward(**to_device(inputs, device))
                loss = self.core.loss(logits, to_device(labels, device))
            objective = loss + l2_penalty(self.core, cfg.l2)  # the recipe's coupled L2, in fp32 outside autocast
            self.scaler.scale(objective / cfg.grad_accumulation).backward()
        detached = loss.detach()
        self.last_loss = detached
        return detached

    def optimiser_step(self, micro_batches: int) -> None:
        cfg = self.cfg
        self.scaler.unscale_(self.optimizer)
        if micro_batches != cfg.grad_accumulation:  # an epoch's last, short accumulation: average what it has
            for parameter in self.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.mul_(cfg.grad_accumulation / micro_batches)
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average is not None:
            self.average.update(self.core)

    def after_step(self, loss: float | torch.Tensor) -> None:
        self.step += 1
        if self.warm is None:  # the first step of this run waits for the data pipeline and warms up
            self.warm = (self.step, time.time())
        self.window += 1
        self.window_loss = self.window_loss + loss
        if self.profile_to:
            self.profile_step()
        if self.step % self.cfg.log_every == 0 or self.step == self.total_steps:
            self.log_progress()

    def profile_step(self) -> None:
        """QA_PROFILE's profiler started PROFILE_STEPS steps before the last (after the first step at the
        earliest), stopped and written at the last."""
        first = max(1, self.total_steps - PROFILE_STEPS)
        if self.profiler is None and self.step == first and first < self.total_steps:
            from torch.profiler import ProfilerActivity, profile

            cuda = self.device.type == "cuda"
            self.profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
            self.profiler.start()
        elif self.profiler is not None and self.profile_to and self.step == self.total_steps:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.profiler.stop()
            steps = self.step - first
            header = f"{steps} steps of the training loop from step {first} ({self.cfg.model}, rank 0)"
            write_profile_tables(self.profiler, self.profile_to, header, self.device.type == "cuda")
            log(f"[train] profile of steps {first + 1}-{self.step} written to {self.profile_to}")
            self.profiler, self.profile_to = None, None

    def after_step_action(self) -> int:
        """Rank 0's decision after a step: STOP + the signal's index once the driver received SIGINT or SIGTERM
        (a checkpoint, then the run ends), CHECKPOINT when --checkpoint-minutes have passed since the last one
        (what a crash or a preemption can cost at most), else GO_ON. Other ranks say GO_ON and follow rank 0."""
        if self.rank != 0:
            return GO_ON
        reason = self.stop_watch.requested() if self.stop_watch else None
        if reason:
            return STOP + (SIGNALS.index(reason) if reason in SIGNALS else 0)
        minutes = self.cfg.checkpoint_minutes
        if minutes and time.time() - self.last_saved >= 60 * minutes:
            return CHECKPOINT
        return GO_ON

    def log_progress(self) -> None:
        """The loss since the last line on the curve; rank 0 also logs it with the rate and ETA."""
        loss = float(self.window_loss) / self.window  # the one read of the losses (a wait for the GPU) a line
        self.curve.append([self.step, loss])
        self.progress_times.append([self.step, time.time()])
        if self.scalars is not None:  # rank 0
            rate = (self.step - self.first_step) / max(1e-9, time.time() - self.started)
            eta = (self.total_steps - self.step) / max(rate, 1e-9)
            lr = float(self.scheduler.get_last_lr()[0])
            self.scalars.add("train/loss", loss, self.step)
            self.scalars.add("train/lr", lr, self.step)
            self.scalars.add("train/examples_per_s", rate * self.examples_per_step, self.step)
            log(
                f"[train] step {self.step}/{self.total_steps} epoch {self.epoch} loss {loss:.4f} lr {lr:.2e} "
                f"{rate * self.examples_per_step:.1f} ex/s ETA {eta:.0f}s"
            )
        self.window, self.window_loss = 0, 0.0

    def finish(self) -> None:
        """The last step's dev figures (and --test-split's, where they are the run's best) in a final checkpoint."""
        # examples per second over this run's steps after its first, on every worker together: what a benchmark
        # compares, without start-up, the first batch's wait for the data pipeline, and the final evaluation
        if self.device.type == "cuda":  # the steps queued on the GPU are part of the time
            torch.cuda.synchronize(self.device)
        ended = time.time()
        timed = (self.step - self.warm[0], ended - self.warm[1]) if self.warm else (0, 0.0)
        examples_per_s = timed[0] * self.examples_per_step / timed[1] if timed[0] else None
        # the last step's dev figures: those of an evaluation at this very step (an early stop), else a new one
        evaluated_now = self.evaluated_at == self.step and self.dev_history and self.dev_history[-1][0] == self.step
        metrics = self.last_dev if evaluated_now else self.dev_metrics()
        self.save(
            {
                "dev": metrics,
                "final": True,
                "examples_per_s": examples_per_s,
                # the wall-clock span examples_per_s is over (a benchmark reads the GPU's busy share within it)
                "timed_window": [self.warm[1], ended] if self.warm else None,
                "progress_times": plain(self.progress_times),
                "stopped_early": self.stopped_early,
            },
            self.held_out(metrics),
        )
        if self.scalars is not None:  # rank 0
            self.scalars.close()

    # ---------------------------------------------------------------------------------- evaluation
    def evaluation_weights(self):
        """The weights the run is scored with: the moving average where the recipe keeps one."""
        return self.average.applied(self.core) if self.average is not None else contextlib.nullcontext(self.core)

    def dev_metrics(self) -> dict:
        if self.rank != 0:
            return {}
        with self.evaluation_weights():
            metrics = evaluate(
                self.core,
                self.batcher,
                self.config["dev_paths"],
                self.config["dev_columns"],
                self.cfg,
                self.device,
                self.dtype,
            )
        self.dev_history.append([self.step, {k: v for k, v in metrics.items() if k != "skipped"}])
        for name, value in metrics.items():
            if name not in ("questions", "skipped") and self.scalars is not None:
                self.scalars.add("dev/" + name.replace("@", "_at_"), value, self.step)
        log(f"[train] step {self.step} epoch {self.epoch} dev {figures_line(metrics)}")
        return metrics

    def held_out(self, metrics: dict) -> tuple[dict, list[dict]] | None:
        """--test-split scored with the final weights where they are the run's best (rank 0); otherwise the
        driver scores the best checkpoint afterwards."""
        cfg = self.cfg
        if not (
            cfg.test_split
            and self.rank == 0
            and best_so_far(metrics.get(self.metric), self.dev_history[:-1], self.metric)
        ):
            return None
        with self.evaluation_weights():
            figures, records = score_split(
                self.core,
                self.batcher,
                self.config["test_paths"],
                self.config["test_columns"],
                cfg,
                self.device,
                self.dtype,
            )
        log(f"[train] step {self.step} {cfg.test_split} {figures_line(figures['metrics'])}")
        return figures, records

    def stop_now(self) -> bool:
        """After a dev evaluation: whether --patience evaluations have passed without a new best (rank 0 decides,
        every worker follows)."""
        cfg = self.cfg
        if not cfg.patience:
            return False
        waited = evaluations_since_best(self.dev_history, self.metric) if self.rank == 0 else 0
        self.stopped_early = _agree(waited >= cfg.patience, self.device)
        if self.stopped_early and self.rank == 0:
            log(
                f"[train] step {self.step}: dev {self.metric} has not improved for {waited} evaluations (--patience "
                f"{cfg.patience}); stopping early"
            )
        return self.stopped_early

    # ---------------------------------------------------------------------------------- checkpoints
    def save(self, metrics: dict, test: tuple[dict, list[dict]] | None = None) -> None:
        """Report `metrics` to Ray Train; rank 0 with a checkpoint of everything a resume needs."""
        import ray.train

        score = (metrics.get("dev") or {}).get(self.metric)
        earlier = [
            f[self.metric] for step, f in self.dev_history if step != self.step and f.get(self.metric) is not None
        ]
        trained = self.trained_before + time.time() - self.segment_started  # every invocation's, lost work aside
        # copies: Ray Train may serialise the metrics after the run has moved on and appended to its lists
        metrics = dict(
            metrics,
            step=self.step,
            epoch=self.epoch,
            resumed_from_step=self.resumed_from,
            curve=plain(self.curve),
            dev_history=plain(self.dev_history),
            trained_seconds=trained,
            resumed_trained_seconds=self.trained_before,
            precision=precision_name(self.dtype),  # what --precision auto resolved to on this device
            device=self.device.type,
            select_metric=self.metric,
            **{SCORE: select_score(score, earlier)},
        )
        if self.scalars is None:  # ranks other than 0
            ray.train.report(metrics, checkpoint=None)
            return
        self.scalars.flush()
        cfg, core = self.cfg, self.core
        self.last_saved = time.time()
        with tempfile.TemporaryDirectory() as directory:
            # Tensors and plain containers only (read back with weights_only=True); the configuration is JSON.
            state = {
                "model": core.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "step": self.step,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "curve": plain(self.curve),
                "dev_history": plain(self.dev_history),
                "stopped_early": self.stopped_early,
                "trained_seconds": float(trained),
                "weight_average": self.average.state_dict() if self.average is not None else None,
            }
            if test and cfg.test_split:  # the held-out split's figures travel with the weights that earned them
                figures, records = test
                write_jsonl(records, os.path.join(directory, predictions_name(cfg.test_split)))
                metrics["test"] = dict(figures, split=cfg.test_split, step=self.step)
            vocabulary = self.config.get("vocab_path")
            if not cfg.encoder_path and vocabulary and os.path.exists(vocabulary):
                # the words' ids travel with the weights: Ranker turns new text into the model's input from them
                shutil.copyfile(vocabulary, os.path.join(directory, VOCAB_FILE))
            write_checkpoint(
                directory,
                state,
                {
                    "train": asdict(cfg),
                    "model_config": asdict(core.config),
                    "vocab_size": self.vocab_size,
                    "vocab_sha256": self.config["vocab_sha256"],
                    # what a resume checks it shares (trainer.check_resume)
                    "data_path_free_sha256": self.config.get("data_path_free_sha256"),
                    "init_checkpoint_sha256": self.config.get("init_checkpoint_sha256"),
                    "text": self.config.get("text") or {},
                    "step": self.step,
                    "dev": plain(metrics.get("dev") or {}),
                },
            )
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def plain(value):
    """`value` with numpy scalars and tuples turned into Python numbers and lists, so that a checkpoint's state
    loads under weights_only=True and its JSON is standard."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
