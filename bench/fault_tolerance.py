"""What a lost worker or node costs a training run, on a multi-node Ray cluster simulated on this machine.

    python bench/fault_tolerance.py --data TOKENISED_DIR [--model gsamn] [--max-steps 300] [--checkpoint-every 20]
        [--failures kill-worker,remove-node] [--json bench/fault_tolerance.json]

Starts `ray.cluster_utils.Cluster`: a head node (Ray Data's reads) and one node per training worker, each with
one CPU (and a spare node when a node is to be removed), then trains the same configuration (same seed) once
uninterrupted and once per failure, injected as soon as Ray Train has recorded the run's first checkpoint:
- kill-worker: SIGKILL one training worker process (a crashed process, an OOM kill);
- remove-node: remove the node of one training worker, raylet and all (a lost machine); the cluster starts with
  one node spare for it, the headroom an autoscaler would otherwise add (Cluster can add nodes only from the
  main thread, which Ray Train's fit holds).
Each failed run must restart its worker group (FailureConfig), continue from its latest checkpoint and finish at
exactly --max-steps; its final weights are compared tensor by tensor with the uninterrupted run's. The cost of a
failure is its wall time over the uninterrupted run's: the group's restart plus the steps redone since the last
checkpoint. The last line is one JSON object (also written to --json, default bench/fault_tolerance.json):
`reference` and one entry per failure with `steps`, `resumed_from_step`, `wall_s`, `lost_s`, `identical_weights`
and `max_abs_weight_difference`.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # bench/tokenize.py would shadow the standard library's tokenize
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here)] + [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse
import json
import signal
import tempfile
import threading
import time

from bench.report import check_result_file, write_result

FAILURES = ("kill-worker", "remove-node")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_WORKER = "ray::RayTrainWorker"


def _log(message: str) -> None:
    print(f"[fault-tolerance] {message}", file=sys.stderr, flush=True)


def train_worker_pids() -> list[int]:
    """Processes of Ray Train's workers (their title is ray::RayTrainWorker.<method>), found in /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read().startswith(TRAIN_WORKER.encode()):
                    pids.append(int(entry))
        except OSError:
            pass
    return sorted(pids)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def node_of(pid: int, nodes: list) -> object | None:
    """The Cluster node whose raylet started process `pid` (workers are the raylet's children)."""
    from ray._private import ray_constants

    raylets = {node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid: node for node in nodes}
    while pid > 1:
        if pid in raylets:
            return raylets[pid]
        try:
            pid = _parent(pid)
        except OSError:  # the process (or an ancestor) ended meanwhile
            return None
    return None


def recorded_checkpoints(run_dir: str) -> int:
    """Checkpoints Ray Train has recorded in the run's snapshot (a folder alone may be one a failure cut off)."""
    try:
        with open(os.path.join(run_dir, "checkpoint_manager_snapshot.json")) as f:
            return len(json.load(f).get("checkpoint_results") or [])
    except (OSError, ValueError):
        return 0


class Injector(threading.Thread):
    """Waits for the run's first recorded checkpoint, then injects `failure` once."""

    def __init__(self, failure: str, run_dir: str, cluster, timeout: float = 600):
        super().__init__(daemon=True)
        self.failure, self.run_dir, self.cluster, self.timeout = failure, run_dir, cluster, timeout
        self.injected_at: float | None = None
        self.detail = ""

    def run(self) -> None:
        deadline = time.time() + self.timeout
        while time.time() < deadline and not recorded_checkpoints(self.run_dir):
            time.sleep(0.2)
        # only this cluster's workers: another Ray on the machine (a results run beside the tests) is not ours to kill
        nodes = [self.cluster.head_node, *self.cluster.worker_nodes]
        pids = [pid for pid in train_worker_pids() if node_of(pid, nodes) is not None]
        if not pids:
            self.detail = "no training worker found"
            return
        if self.failure == "kill-worker":
            os.kill(pids[-1], signal.SIGKILL)
            self.detail = f"SIGKILL to training worker {pids[-1]}"
        else:
            nodes = [node_of(pid, self.cluster.worker_nodes) for pid in reversed(pids)]
            node = next((n for n in nodes if n is not None), None)
            if node is None:
                self.detail = "no training worker on a removable node"
                return
            self.cluster.remove_node(node, allow_graceful=False)
            self.detail = f"removed node {node.node_id[:12]}"
        self.injected_at = time.time()
        _log(f"{self.failure}: {self.detail}")


def final_weights(summary: dict) -> dict:
    from training.checkpoints import read_state

    return read_state(summary["checkpoint"])["model"]


def compare(weights: dict, reference: dict) -> tuple[bool, float]:
    import torch

    identical = weights.keys() == reference.keys() and all(torch.equal(weights[k], reference[k]) for k in reference)
    difference = max(float((weights[k].float() - reference[k].float()).abs().max()) for k in reference)
    return identical, difference


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="tokenised answer-selection folder (jobs/tokenize_corpora.py)")
    p.add_argument("--model", default="gsamn")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--num-workers", type=int, default=2, help="training workers, one node each")
    p.add_argument("--failures", default=",".join(FAILURES), help=f"comma-separated, of {', '.join(FAILURES)}")
    p.add_argument("--storage-path", default=None, help="runs go here (default: a temporary folder)")
    p.add_argument("--verbose", action="store_true", help="show the training workers' logs")
    p.add_argument(
        "--json", default=os.path.join(REPO, "bench", "fault_tolerance.json"), help="where to write the figures"
    )
    args = p.parse_args(argv)
    check_result_file(p, args.json, "reference")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    failures = [f for f in args.failures.split(",") if f]
    unknown = sorted(set(failures) - set(FAILURES))
    if unknown:
        raise SystemExit(f"--failures: unknown {', '.join(unknown)} (choose from {', '.join(FAILURES)})")

    import ray
    from ray.cluster_utils import Cluster

    from runtime.ray_env import forget_recorded_cluster, local_ray_env
    from training.config import TrainConfig
    from training.trainer import run

    for name, value in local_ray_env(1).items():  # nodes of one CPU
        os.environ.setdefault(name, value)
    storage = args.storage_path or tempfile.mkdtemp(prefix="fault-tolerance-")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(args.num_workers + ("remove-node" in failures)):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=args.verbose)
    _log(f"cluster of {len(cluster.list_all_nodes())} nodes; runs under {storage}")
    results: dict = {
        "model": args.model,
        "max_steps": args.max_steps,
        "checkpoint_every": args.checkpoint_every,
        "num_workers": args.num_workers,
        "nodes": len(cluster.list_all_nodes()),
    }
    try:
        reference = None
        for failure in ["none"] + failures:
            cfg = TrainConfig(
                model=args.model,
                data=args.data,
                storage_path=storage,
                name=failure,
                max_steps=args.max_steps,
                checkpoint_every=args.checkpoint_every,
                batch_size=args.batch_size,
                dim=args.dim,
                num_workers=args.num_workers,
                cpus_per_worker=1,
                max_failures=2,
                log_every=max(1, args.max_steps // 10),
                seed=0,
            )
            injector = Injector(failure, os.path.join(storage, failure), cluster) if failure != "none" else None
            if injector:
                injector.start()
            started = time.time()
            summary = run(cfg)
            wall = time.time() - started
            entry = {
                "steps": summary["steps"],
                "resumed_from_step": summary["resumed_from_step"],
                "wall_s": round(wall, 2),
            }
            weights = final_weights(summary)
            if reference is None:
                reference = (weights, wall)
            else:
                entry["injected"] = injector.detail if injector.injected_at else f"not injected: {injector.detail}"
                entry["lost_s"] = round(wall - reference[1], 2)
                entry["identical_weights"], entry["max_abs_weight_difference"] = compare(weights, reference[0])
            results["reference" if failure == "none" else failure] = entry
            _log(f"{failure}: {json.dumps(entry)}")
    finally:
        ray.shutdown()
        cluster.shutdown()
        forget_recorded_cluster(cluster.address)
    write_result(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
