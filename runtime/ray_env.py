"""Starting or joining Ray for a job, and stopping only what the job started.

Under `ray job submit` (RAY_ADDRESS is set) a job joins the cluster; run directly it starts a private local
instance and shuts it down on exit. `ray stop` would kill every Ray process on the machine, so it is never
used.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys

# Memory allocators for Ray workers. With Arrow's default (mimalloc) and glibc's arena per thread, a worker
# that has run a few large tasks keeps their memory while idle: measured on a 500k-post StackExchangeQA build
# (bench/stackexchangeqa.py), idle workers held 1,160 MB of heap; with these, 170 MB, and the build ran 8%
# faster. Variables a job already sets win.
WORKER_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}


# Ray settings of a private local instance (a laptop, a test), read by the raylet from its environment. Spill
# and restore workers: Ray's default is up to 4 of each, each a Python process; measured building StackExchangeQA
# from 1M posts with a 0.5 GB object store (bench/stackexchangeqa.py), they held 244 MB of heap at the peak, and
# 43 MB with one of each, and the build's heaps went from 1.28x to 1.06x those of a 100k-post build, at the same
# throughput. On one machine's disk, more spill workers do not spill faster. A cluster keeps its own setting.
LOCAL_RAY_ENV = {"RAY_max_io_workers": "1"}

# Ray Train's preemption watcher: an actor a training run, polling Ray Core's drain state every 5 s for the notice a
# cluster's autoscaler gives before it reclaims a node. Nothing drains the one node of a private instance, so there
# it watches for nothing, at the cost of a Python process a run that imports Ray Train (about 2 s of CPU: the
# hour plan's TrecQA CTRN run on 2 cores, four times each way, took 49.1 s of CPU with it and 47.3 s without,
# medians, every Ray process counted) and of the error line Ray prints as it starts the watcher, in every run's log
# ("has constructor arguments in the object store and max_restarts > 0", ray-project/ray#53727). Off for a private
# instance only (`init_local_ray`); a cluster (and a user's own setting) keeps it.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def _cpu_count(text: str) -> int:
    try:
        cpus = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of CPUs, got {text!r}") from None
    if cpus < 1:  # a local Ray of 0 CPUs schedules no task: the job waited for ever (measured: tokenize_corpora)
        raise argparse.ArgumentTypeError(f"must be at least 1, got {cpus}")
    return cpus


def add_local_ray_options(parser: argparse.ArgumentParser) -> None:
    """--num-cpus and --verbose, the options of every job that runs on Ray (`run_on_ray`). --num-cpus below 1 is
    refused while parsing, exit 2."""
    parser.add_argument(
        "--num-cpus",
        type=_cpu_count,
        default=None,
        help="CPUs for the local Ray started when not on a cluster (default: every core)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print Ray's INFO lines (execution plans, worker groups) and progress bars; without it "
        "they go to the Ray session's log files only (/tmp/ray/session_latest/logs)",
    )


def local_cpus(num_cpus: int | None = None) -> float:
    """The CPUs of the private local Ray a job run directly starts: --num-cpus, else what Ray finds on this machine
    (a container's CPU quota included)."""
    if num_cpus:
        return float(num_cpus)
    from ray._private.utils import get_num_cpus  # Ray's own count, so the check and the instance agree

    return float(get_num_cpus())


def check_fits_local_ray(
    option: str,
    units: int = 1,
    unit: str = "task",
    options: str = "",
    cpus: float = 0.0,
    gpus: float = 0.0,
    num_cpus: int | None = None,
) -> None:
    """Refuse, before Ray starts, a request that the private local Ray of a job run directly could never place:
    Ray waits for the resources for ever (Ray Train's worker group times out and starts again every minute, a
    traceback each time; a Ray Data actor or task that cannot be placed never starts). `units` (workers, actors) of
    `cpus` CPUs and `gpus` GPUs each, named by `options`, must be placed at once: CPUs add up on the one node;
    fractions of a GPU share one GPU, and more than one GPU is whole GPUs. On a cluster (RAY_ADDRESS) the request
    stands: an autoscaler may add nodes."""
    if os.environ.get("RAY_ADDRESS") or not (cpus or gpus):
        return
    import math

    from runtime.checks import UsageError

    def each(amount: float, resource: str) -> str:
        asked = f"{amount:g} {resource}{'s' if amount > 1 else ''}"
        what = f"{units} {unit}s of {asked} each" if units > 1 else f"one {unit} of {asked}"
        return what + (f" ({options})" if options else "")

    if cpus:
        have = local_cpus(num_cpus)
        if units * cpus > have + 1e-9:
            raise UsageError(
                f"{option}: {each(cpus, 'CPU')} cannot be placed: the local Ray the job starts has {have:g} CPUs"
                f"{' (--num-cpus)' if num_cpus else ' (every core of this machine)'}, and would wait for them for "
                "ever (ask for fewer, or submit to a cluster: RAY_ADDRESS)"
            )
    if gpus:
        import torch

        have_gpus = torch.cuda.device_count()  # what Ray finds on this node too: both read CUDA_VISIBLE_DEVICES
        if gpus <= 1:  # as many units on a GPU as whole fractions fit in it
            placed = units <= have_gpus * math.floor(1 / gpus + 1e-9)
        else:
            placed = units * math.ceil(gpus) <= have_gpus
        if placed:
            return
        found = f"this machine has {have_gpus}" if have_gpus else "this machine has none that CUDA sees"
        raise UsageError(
            f"{option}: {each(gpus, 'GPU')} cannot be placed: {found}, and the local Ray the job starts would wait "
            "for them for ever (leave the option out to run on the CPUs, or submit to a cluster with GPUs: "
            "RAY_ADDRESS)"
        )


def local_ray_env(num_cpus: int | None = None) -> dict[str, str]:
    """LOCAL_RAY_ENV, and a worker pool that keeps warm workers through a shuffle.

    The raylet kills a worker idle for a second once the node runs more workers than
    `num_workers_soft_limit` (its CPUs by default). A Ray Data hash shuffle starts up to one aggregator actor per
    CPU, each in a process of its own, so during every shuffle the task workers (which have imported Ray Data,
    Arrow and our stages, seconds of CPU each) were killed, and the stages after it ran on cold ones. Twice the CPUs
    (task workers plus aggregators) keeps them, at the cost of the warm workers' imports and caches in memory
    (bench/stackexchangeqa.py measures both; docs/bench/stackexchangeqa-warm-workers*.json).

    The raylet also warns, on the driver's console, once its workers outnumber four times its worker start-up
    concurrency (its CPUs by default): "8 PYTHON worker processes have been started ... 4x the maximum expected
    startup concurrency (2)", which every training run on 2 cores met (two task workers kept warm, the Ray Train
    controller and worker, Ray Data's read and split actors). The start-up concurrency follows the worker pool
    that this project expects, twice the CPUs, so the warning is kept for a real runaway."""
    cpus = num_cpus or os.cpu_count() or 1
    return {
        **LOCAL_RAY_ENV,
        "RAY_num_workers_soft_limit": str(2 * cpus),
        "RAY_worker_maximum_startup_concurrency": str(2 * cpus),
    }


def worker_env() -> dict[str, str]:
    """WORKER_ENV less what this process's environment (for a submitted job, its runtime env) already sets."""
    return {k: v for k, v in WORKER_ENV.items() if k not in os.environ}


def check_ray_address(address: str, timeout: float = 10.0) -> None:
    """A RAY_ADDRESS (HOST:PORT, or ray://HOST:PORT) at which nothing answers is refused in one line naming it:
    `ray.init` retried it for ever, a warning every 40 s (measured: RAY_ADDRESS=127.0.0.1:1, still waiting when
    killed after 200 s), as after a cluster was taken down and the variable left set. Other forms (auto, an
    HTTP address) are Ray's to read."""
    target = address[len("ray://") :] if address.startswith("ray://") else address
    host, _, port = target.rpartition(":")
    if "://" in target or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return
    except OSError as error:
        from runtime.checks import UsageError

        raise UsageError(
            f"RAY_ADDRESS={address}: no Ray cluster answers there ({error.strerror or error}); start it "
            "(infra/local_cluster.py up), or unset RAY_ADDRESS to run on a local Ray of this machine"
        ) from None


def init_local_ray(**kwargs) -> None:
    """`ray.init` of a private local instance whose workers use WORKER_ENV (they inherit the raylet's
    environment, which is this process's).

    Always a new instance (address "local"): without it `ray.init` joins whatever cluster the last `ray start`
    or `ray.cluster_utils.Cluster` on this machine recorded in /tmp/ray/ray_current_cluster, even a dead one,
    and then refuses num_cpus."""
    import ray

    os.environ.update(worker_env())
    for key, value in local_ray_env(kwargs.get("num_cpus")).items():
        os.environ.setdefault(key, value)
    # Ray Train passes it from the driver to its controller; a job joining this instance (experiments/results.py's
    # runs) inherits it with RAY_ADDRESS
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
    if kwargs.get("include_dashboard") and "dashboard_port" not in kwargs:
        # The State API's clients inside Ray (Ray Train's PlacementGroupCleaner asks it every second) find their
        # cluster by RAY_API_SERVER_ADDRESS or RAY_ADDRESS, else by looking for running instances; with a second
        # instance on the machine (another job, a `ray start`) the search fails ("Found multiple active Ray
        # instances") and the cleaner prints that traceback every second. The workers inherit this process's
        # environment, so naming this instance's dashboard here answers them all.
        kwargs["dashboard_port"] = free_port()
        os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{kwargs['dashboard_port']}"
    # Every worker, Ray Data's own shuffle workers included (our stages start it only in the workers that run
    # them), hands its freed heap back when it falls idle (pipelines.blocks.trim_when_idle): at the peak of a
    # 1M-post StackExchangeQA build idle workers held 1.2-1.4 GB of heap without it, 0.8 GB with it.
    kwargs.setdefault("runtime_env", {}).setdefault("worker_process_setup_hook", "pipelines.blocks.trim_when_idle")
    ray.init(address="local", **kwargs)


# Ports Ray itself takes on a node: its workers' (10002-19999 by default) and, above them, the kernel's ephemeral
# range, which every outgoing connection and every bind to port 0 draws from.
RAY_WORKER_PORTS_END = 19999


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere the gap is only a guess, and bind() still checks


def free_port() -> int:
    """A port free now on 127.0.0.1, for a server Ray starts a moment later. Drawn at random between Ray's worker
    ports and the kernel's ephemeral range, where nothing takes a port unasked: a port from bind(0) comes from the
    ephemeral range, and another local Ray starting beside this one (its gRPC servers and connections) took it
    before Ray bound it (measured: a training test beside another job, `Failed to bind to 127.0.0.1:35699 because
    it's already occupied`). Where that gap is too narrow (a custom ip_local_port_range), the kernel picks."""
    import random

    gap = range(RAY_WORKER_PORTS_END + 1, ephemeral_start())
    draw = random.SystemRandom()
    for _ in range(64 if len(gap) >= 1000 else 0):
        port = draw.choice(gap)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def forget_recorded_cluster(gcs_address: str) -> None:
    """Remove /tmp/ray/ray_current_cluster (Ray's temp dir) if it records the cluster at `gcs_address`: `ray start
    --head` and `ray.cluster_utils.Cluster` write it and leave it behind, and a later plain `ray.init()` would try
    to join the dead cluster. Matched by port, since the record names the node's IP where callers may know the
    cluster as 127.0.0.1; another cluster's record is left alone."""
    from ray._private.utils import get_ray_address_file

    path = get_ray_address_file(None)
    with contextlib.suppress(OSError):
        with open(path) as f:
            recorded = f.read().strip()
        if recorded.rsplit(":", 1)[-1] == gcs_address.rsplit(":", 1)[-1]:
            os.remove(path)


# What a quiet job keeps off the console (it all still goes to the Ray session's log files, under
# /tmp/ray/session_latest/logs): Ray Data's INFO lines (each execution's plan, "Starting execution", "Full logs
# are in"), the notice that progress bars are off, Ray Train's INFO lines (resources, worker group, process group)
# and Hugging Face's progress bars. Warnings from Ray itself (spilling, a worker lost, a retry) still show.
_QUIET = {"verbose": False}


def quiet() -> bool:
    """Whether this job keeps Ray's and libraries' INFO output off the console (no --verbose)."""
    return not _QUIET["verbose"]


def train_log_level() -> str:
    """Ray Train's console level for this job (RunConfig.logging_config)."""
    return "WARNING" if quiet() else "INFO"


def _quiet_ray_data_logging() -> None:
    """Ray Data's own logging configuration with its console handler at WARNING (its log file keeps DEBUG), and
    the progress-bar notice and user-code tracebacks to the file only: written beside the temp files and named
    by RAY_DATA_LOGGING_CONFIG, which the workers of a local Ray inherit; the driver's Ray Data (configured when
    imported) is configured again from it."""
    import copy
    import tempfile

    import yaml
    from ray.data._internal import logging as data_logging

    config: dict = copy.deepcopy(data_logging.DEFAULT_CONFIG)
    config["handlers"]["console"]["level"] = "WARNING"
    # To the file only: the progress-bar notice, and a failed task's traceback (the job ends with one line
    # naming the error and the file that holds the whole traceback).
    for name in ("ray.data._internal.progress", "ray.data.exceptions"):
        config["loggers"][name] = {"level": "DEBUG", "handlers": ["file"], "propagate": False}
    # The executor's report of a failed task (the task's traceback, 80-odd lines) to the file only as well.
    config["filters"]["task_errors"] = {"()": "runtime.ray_env.TaskErrorFilter"}
    config["filters"]["no_free_cpu"] = {"()": "runtime.ray_env.NoFreeCpuFilter"}
    config["handlers"]["console"]["filters"] = config["handlers"]["console"].get("filters", []) + [
        "task_errors",
        "no_free_cpu",
    ]
    path = os.path.join(tempfile.gettempdir(), f"qa-ray-data-logging-{os.getuid()}.yaml")
    staged = f"{path}.{os.getpid()}"
    with open(staged, "w") as f:
        yaml.safe_dump(config, f)
    os.replace(staged, path)
    os.environ[data_logging.RAY_DATA_LOGGING_CONFIG_ENV_VAR_NAME] = path
    data_logging.configure_logging()


class TaskErrorFilter(logging.Filter):
    """Keeps Ray Data's "An exception was raised from a task of operator ..." (logged with the task's whole
    traceback as the execution aborts) off the console: the job ends with one line naming the cause instead, and
    Ray Data's log file keeps the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno >= logging.ERROR
            and str(record.msg).startswith("An exception was raised from a task of operator")
        )


class NoFreeCpuFilter(logging.Filter):
    """Keeps Ray Data's "The Ray cluster currently does not have any available CPUs. The Dataset job will hang
    unless more CPUs are freed up" off the console. `Dataset.materialize()` checks this a second time as it ends,
    to hand back blocks already made, while the stage's own actor pool is still giving back its CPUs: a stage that
    did not hang told the user it might. `pipelines.blocks.materialize` makes the check that means something,
    before a stage starts, and says so in a line of its own; the log file keeps Ray's record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "does not have any available CPUs" not in str(record.msg)


def quiet_progress_bars() -> None:
    """Library progress bars off in this process and the processes it starts (a user's own setting wins):
    transformers 5 draws a "Loading weights" bar each time it loads an encoder, which is not the job's progress.
    Read by transformers when it is first imported, so called before that."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@contextlib.contextmanager
def ray_session(num_cpus: int | None = None, quiet: bool = True, state_api: bool = False):
    """Join the cluster named by RAY_ADDRESS, or start (and later stop) a private local Ray.

    `quiet`: Ray Data's and Ray Train's INFO lines and library progress bars go to the session's log files only
    (see _QUIET); `quiet=False` is a job's --verbose.

    `state_api`: start the local instance's dashboard, which serves Ray's State API. Ray Train needs it: its
    detached PlacementGroupCleaner asks the State API every second whether the training controller is alive,
    and without a dashboard each question fails with a warning ("Failed to query Ray Train Controller actor
    state"), dozens of lines a minute. Jobs that only use Ray Data leave it off (one process fewer)."""
    import ray

    _QUIET["verbose"] = not quiet
    if quiet:
        quiet_progress_bars()
        _quiet_ray_data_logging()
    from ray.data import DataContext

    started = False
    if not ray.is_initialized():
        # the dashboard (the State API) whether or not the job is quiet: a --verbose training job without it met
        # "Found multiple active Ray instances" beside another Ray on the machine, every second
        kwargs: dict = {"include_dashboard": state_api, **({"logging_level": logging.WARNING} if quiet else {})}
        if os.environ.get("RAY_ADDRESS"):
            check_ray_address(os.environ["RAY_ADDRESS"])
            # Ray merges this with the submitted job's runtime env; worker_env() leaves out what the job set,
            # so the two never conflict.
            ray.init(
                address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING, runtime_env={"env_vars": worker_env()}
            )
        else:
            if quiet:  # Ray turns token authentication on for a new local instance (its default) and says so
                logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            init_local_ray(num_cpus=num_cpus, **kwargs)
            started = True
    context = DataContext.get_current()
    context.enable_progress_bars = sys.stderr.isatty()
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def run_on_ray(job: str, work, num_cpus: int | None = None, state_api: bool = False, verbose: bool = False):
    """Run `work()` inside `ray_session`; return (result, 0), or print one clear line and return (None, code).

    The line names the job and the user's error (the file, row or URL, and the problem), whichever Ray task or
    training worker raised it; the whole traceback goes to a log file that the line names (runtime.errors)."""
    from runtime.errors import fail

    try:
        with ray_session(num_cpus, quiet=not verbose, state_api=state_api):
            return work(), 0
    except KeyboardInterrupt as stop:  # Ctrl-C: the local Ray is shut down on the way out; no traceback
        print(f"{job}: stopped{': ' + str(stop) if str(stop) else ' by SIGINT'}", file=sys.stderr, flush=True)
        return None, 128 + getattr(stop, "signum", 2)  # 130 for SIGINT, 143 for SIGTERM
    except Exception as err:  # one line naming the file or row, not Ray's wrapped traceback
        return None, fail(job, err)
