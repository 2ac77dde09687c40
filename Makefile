# Two commands on a fresh clone: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU torch by default. Where no local CPU wheel is configured, add the CPU index, for example
#   make demo TORCH_INDEX=--extra-index-url=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

# The demo input: any Posts.xml or Posts.xml.gz of an official Stack Exchange dump (see README).
DUMP ?= ../shared/data/stackexchange_dump_beer/Posts.xml.gz
OUT ?= out/demo
NEGATIVES ?= 4
# GSAMN's memory starts from a pretrained encoder, as in its paper (MiniLM, shipped in a PyPI package), fine-tuned
# for 192 steps of 16 pairs at 1e-4 (1e-3 for the layers on top; on 2 cores about 3 minutes); ENCODER=none trains
# word embeddings from scratch instead (EPOCHS of them). The one training worker takes every core (up to 8):
# Ray gives a worker as many torch threads as CPUs it reserves, and the demo's reads need next to none. Beside the
# trained model's dev figures, the same encoder untrained (zero-shot cosine) on the same dev questions.
ENCODER ?= minilm
EPOCHS ?= 3
DEMO_CPUS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 8 ] && n=8; echo $$n)
ifeq ($(ENCODER),none)
DEMO_TRAIN_ARGS ?= --dim 128 --epochs $(EPOCHS) --checkpoint-every 100 --cpus-per-worker $(DEMO_CPUS)
else
DEMO_TRAIN_ARGS ?= --encoder-path $(ENCODER) --max-len 96 --batch-size 16 --max-steps 192 --lr 1e-4 --head-lr 1e-3 \
	--length-buckets 8 --cpus-per-worker $(DEMO_CPUS) --log-every 64
endif

.PHONY: demo test test-fast lint install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_INDEX) torch==2.13.0
	$(PY) -m pip install --quiet $(TORCH_INDEX) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) jobs/build_stackexchangeqa.py --dump $(DUMP) --output $(OUT)/stackexchangeqa --negatives $(NEGATIVES)
	$(PY) jobs/tokenize_corpora.py --dataset stackexchangeqa --input $(OUT)/stackexchangeqa --output $(OUT)/tokenised
	@rm -rf $(OUT)/runs/gsamn-demo
	$(PY) jobs/train.py --model gsamn --data $(OUT)/tokenised --storage-path $(OUT)/runs --name gsamn-demo $(DEMO_TRAIN_ARGS) > $(OUT)/train_summary.json
ifneq ($(ENCODER),none)
	$(PY) jobs/zero_shot.py --data $(OUT)/tokenised --split dev --encoder-path $(ENCODER) > $(OUT)/zero_shot_summary.json
endif
	@echo "data card $(OUT)/stackexchangeqa/DATA_CARD.md (funnel.png beside it); summary $(OUT)/train_summary.json"
	@echo "training curve $(OUT)/runs/gsamn-demo/training_curve.png; TensorBoard: tensorboard --logdir $(OUT)/runs/gsamn-demo/tensorboard"

# Before committing: `make lint` (ruff's rules and format, mypy over the packages) and `make test-fast` (every test
# that starts no Ray and trains nothing: a couple of minutes on 2 cores). `make test` is the whole suite (CI).
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test-fast: install
	$(PY) -m pytest -q -m "not ray and not slow" tests

test: install
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) out
