"""A multi-node Ray cluster on one machine, for trying `ray job submit` end to end before a real cluster.

    python infra/local_cluster.py up [--nodes 2] [--cpus-per-node 1] [--head-cpus 1] [--dashboard-port 8265]
    python infra/local_cluster.py status
    python infra/local_cluster.py down

`up` runs `ray start --head` (the GCS, the dashboard and its job server) and then `ray start --address` once per
extra node: separate raylets, object stores and worker pools, as on separate machines, so a job's tasks and
training workers spread over nodes exactly as they would on a cluster. Everything lives under one temp dir
(`--temp-dir`, default /tmp/qa-local-cluster), and `down` stops only the processes of that cluster (Ray's
programs whose command lines name it), never other Ray instances on the machine as `ray stop` would, nor a
`tail -f` of one of its logs. Token authentication
(on by default since Ray 2.5x) is turned off with RAY_AUTH_MODE=disabled for this cluster's processes: the job
server listens on 127.0.0.1 only. Submit with the same setting:

    export RAY_AUTH_MODE=disabled RAY_ADDRESS=http://127.0.0.1:8265
    ray job submit --working-dir . -- python jobs/train.py ...
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

DEFAULT_TEMP_DIR = "/tmp/qa-local-cluster"  # short: Ray's Unix socket paths live under it
OBJECT_STORE_MIN_MB = 75  # Ray's OBJECT_STORE_MINIMUM_MEMORY_BYTES: `ray start` refuses less, after the head started


def _ray() -> str:
    """The `ray` command of this interpreter's environment."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    return beside if os.path.exists(beside) else (shutil.which("ray") or "ray")


def _env() -> dict:
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    # A submitted job's `python` is found on the head's PATH: make it this environment's, which has the project.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # What runtime/ray_env.py gives a private local Ray: memory allocators that return memory, one spill worker.
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    env.setdefault("MALLOC_ARENA_MAX", "2")
    env.setdefault("RAY_max_io_workers", "1")
    return env


def _worker_pool_env(cpus: int) -> dict[str, str]:
    """A node's worker pool as runtime/ray_env.py sizes a private local Ray's (warm workers through a shuffle)."""
    from runtime.ray_env import local_ray_env

    return {k: v for k, v in local_ray_env(max(1, cpus)).items() if k not in os.environ}


def _free_port() -> int:
    """A port nothing listens on now (`runtime.ray_env.free_port`). Ray's fixed defaults (the dashboard agent's
    52365, the client server's 10001) are taken by any other Ray on the machine, even a plain `ray.init()`, and a
    head whose agent cannot bind never runs a submitted job."""
    from runtime.ray_env import free_port

    return free_port()


def _state_file(temp_dir: str) -> str:
    return os.path.join(temp_dir, "qa-local-cluster.json")


def _ray_package() -> str:
    """The folder of the `ray` package this interpreter would import (found without importing it)."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.origin:
        raise SystemExit("ray is not installed in this environment (make install)")
    return os.path.dirname(spec.origin)


def _processes(temp_dir: str, ray_package: str | None = None) -> list[int]:
    """PIDs of the cluster's processes: programs of Ray's package (the GCS, raylets, dashboard, log monitors,
    agents) whose command line names `temp_dir` or a path under it. Naming the folder is not enough: a
    `tail -f` of one of its logs, an editor, or the shell and `timeout` that started this very command name it
    too, and `down` killed them."""
    ray_package = (ray_package or _ray_package()).rstrip("/") + "/"
    names = re.compile(re.escape(temp_dir.rstrip("/")) + r"(/|$)")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        runs_ray = any(a.startswith(ray_package) for a in args[:3])  # the binary, or python [-u] the script
        if runs_ray and any(names.search(a) for a in args[1:]):
            found.append(int(entry))
    return found


def _run(command: list[str], **extra_env: str) -> None:
    result = subprocess.run(command, env={**_env(), **extra_env}, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")


def _wait_for_nodes(gcs_address: str, nodes: int, timeout: float = 120) -> list[dict]:
    """The alive nodes once there are `nodes` of them (asks the GCS through a short-lived driver)."""
    code = (
        "import json, ray\n"
        f"ray.init(address={gcs_address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "print(json.dumps([{'node': n['NodeID'][:8], 'address': n['NodeManagerAddress'],"
        " 'resources': n['Resources']} for n in ray.nodes() if n['Alive']]))\n"
    )
    deadline = time.time() + timeout
    alive: list[dict] = []
    while time.time() < deadline:
        result = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
        if result.returncode == 0:
            alive = json.loads(result.stdout.strip().splitlines()[-1])
            if len(alive) >= nodes:
                return alive
        time.sleep(1)
    raise SystemExit(f"only {len(alive)} of {nodes} nodes came up within {timeout:.0f} s")


def _wait_for_job_server(url: str, timeout: float = 180) -> str:
    """Wait until the job server runs jobs: it answers HTTP before the head's dashboard agent, which runs job
    drivers, has registered, and submissions meanwhile fail with "No available agent". A no-op job proves it."""
    env = dict(_env(), RAY_ADDRESS=url)
    deadline, last = time.time() + timeout, ""
    while time.time() < deadline:
        submission = f"local-cluster-ready-{int(time.time())}"
        result = subprocess.run(
            [_ray(), "job", "submit", "--submission-id", submission, "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode == 0:
            return submission
        last = ((result.stderr or result.stdout).strip().splitlines() or [""])[-1]
        time.sleep(2)
    raise SystemExit(f"the job server at {url} ran no job within {timeout:.0f} s: {last}")


def up(args) -> dict:
    if _processes(args.temp_dir):
        raise SystemExit(f"a cluster under {args.temp_dir} is running: `python infra/local_cluster.py down` first")
    os.makedirs(args.temp_dir, exist_ok=True)
    ray = _ray()
    _run(
        [
            ray,
            "start",
            "--head",
            f"--port={args.port}",
            f"--num-cpus={args.head_cpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={args.dashboard_port}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--ray-client-server-port={_free_port()}",
            f"--temp-dir={args.temp_dir}",
            "--disable-usage-stats",
        ],
        **_worker_pool_env(args.head_cpus),
    )
    gcs = f"127.0.0.1:{args.port}"
    for _ in range(args.nodes):
        _run(
            [
                ray,
                "start",
                f"--address={gcs}",
                f"--num-cpus={args.cpus_per_node}",
                f"--object-store-memory={args.object_store_mb << 20}",
                f"--dashboard-agent-listen-port={_free_port()}",
                "--disable-usage-stats",
            ],
            **_worker_pool_env(args.cpus_per_node),
        )
    nodes = _wait_for_nodes(gcs, args.nodes + 1)
    url = f"http://127.0.0.1:{args.dashboard_port}"
    ready = _wait_for_job_server(url)
    state = {
        "gcs_address": gcs,
        "dashboard": url,
        "temp_dir": args.temp_dir,
        "nodes": nodes,
        "ready_job": ready,
        "submit": f"RAY_AUTH_MODE=disabled RAY_ADDRESS={url} ray job submit --working-dir . -- python jobs/...",
    }
    with open(_state_file(args.temp_dir), "w") as f:
        json.dump(state, f, indent=2)
    return state


def status(args) -> dict:
    try:
        with open(_state_file(args.temp_dir)) as f:
            state = json.load(f)
    except FileNotFoundError:
        return {"running": False, "temp_dir": args.temp_dir}
    running = bool(_processes(args.temp_dir))
    if running:
        state["nodes"] = _wait_for_nodes(state["gcs_address"], 1, timeout=30)
    return dict(state, running=running)


def down(args) -> dict:
    pids = _processes(args.temp_dir)
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.time() + wait
        while time.time() < deadline and _processes(args.temp_dir):
            time.sleep(0.2)
        pids = _processes(args.temp_dir)
        if not pids:
            break
    # ray start records the head's address for later `ray.init()` calls to join; a stale one misleads them.
    from runtime.ray_env import forget_recorded_cluster

    with contextlib.suppress(OSError, ValueError, KeyError), open(_state_file(args.temp_dir)) as f:
        forget_recorded_cluster(json.load(f)["gcs_address"])
    with contextlib.suppress(FileNotFoundError):
        os.remove(_state_file(args.temp_dir))
    return {"stopped": not pids, "left_running": pids}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["up", "status", "down"])
    p.add_argument("--nodes", type=int, default=2, help="worker nodes besides the head (default 2)")
    p.add_argument("--cpus-per-node", type=int, default=1, help="logical CPUs of each worker node (default 1)")
    p.add_argument(
        "--head-cpus",
        type=int,
        default=1,
        help="logical CPUs of the head, for drivers' Ray Data tasks (default 1; a real cluster's head "
        "runs drivers only: 0)",
    )
    p.add_argument("--object-store-mb", type=int, default=512, help="object store of each worker node (MB)")
    p.add_argument("--port", type=int, default=6380, help="the GCS port (default 6380, beside a default Ray)")
    p.add_argument("--dashboard-port", type=int, default=8265, help="dashboard and job server (default 8265)")
    p.add_argument("--temp-dir", default=DEFAULT_TEMP_DIR, help=f"the cluster's temp dir ({DEFAULT_TEMP_DIR})")
    args = p.parse_args(argv)
    for option, value, low in (
        ("--nodes", args.nodes, 0),
        ("--cpus-per-node", args.cpus_per_node, 1),  # a node of 0 CPUs runs no task: a job placed there waits
        ("--head-cpus", args.head_cpus, 0),
        ("--object-store-mb", args.object_store_mb, OBJECT_STORE_MIN_MB),
        ("--port", args.port, 1),
        ("--dashboard-port", args.dashboard_port, 1),
    ):
        port = option.endswith("port")
        if value < low or (port and value > 65535):
            p.error(f"{option} must be {'a port, 1 to 65535' if port else f'at least {low}'}; got {value}")
    if args.command == "up" and args.head_cpus + args.nodes * args.cpus_per_node == 0:
        p.error("--head-cpus 0 with --nodes 0: a cluster without a CPU runs no task")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.temp_dir = os.path.abspath(args.temp_dir)
    result = {"up": up, "status": status, "down": down}[args.command](args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
