"""Every model learns. Each answer-selection model, trained for a few seconds on a WikiQA train subset, ranks the
answers of held-out WikiQA questions clearly better than chance (MAP against the expected MAP of a random
order), and its training loss falls. DynSAN, trained for one pass over 2,000 SQuAD questions, gives the answers
of 300 questions about other articles a clearly higher likelihood than before training and than a uniform
guess. Gaps are asserted, not exact numbers. Batches come from the training loop's own Batcher and
qa_models.batching.passage_batch.

Beating chance alone would not prove learning: an untrained siamese model already ranks above chance (dev MAP
0.39-0.52 here against 0.41), since question and answer share embeddings and overlapping words give similar
states; 300 questions and two epochs from random embeddings lift it to about 0.47-0.61."""

import os
import re

import numpy as np
import pytest
import torch

from pipelines.readers import read_wikiqa
from qa_models import MODELS
from qa_models.metrics import per_question_ranking, ranking_metrics
from qa_models.references import random_ranking
from training.config import TrainConfig
from training.data import Batcher
from training.models import build_model

pytestmark = pytest.mark.slow  # every test here trains a model

ANSWER_SELECTION = [
    "gsamn",
    "bert-transformer",
    "bert",
    "ctrn",
    "qrnn",
    "ggsa",
    "iggsa",
    "global-sa",
    "group-sa",
    "local-sa",
    "local-sa-gate",
    "qa-lstm",
    "qa-lstm-attention",
    "iarnn-word",
    "iarnn-context",
    "iarnn-gate",
    "iarnn-occam-word",
    "iarnn-occam-context",
    "oarnn",
    "gru",
]
SMALL = {
    "dim": 48,
    "embed_dim": 48,
    "filters": 48,
    "hidden": 48,
    "ffn_dim": 96,
    "lstm_hidden": 24,
    "mlp_hidden": 48,
    "dropout": 0.0,
    "embed_dropout": 0.0,
    "freeze_embeddings": False,
    "heads": 4,
}
GAP = 0.05
# iGGSA, with its extra feed-forward residual, needs more passes. The IARNN family starts from its paper's
# initialisation (every matrix's largest singular value 1): word attention and the plain GRU start slowly at 3e-3
# and learn at 1e-2; context attention learns at 3e-3 and no longer at 1e-2.
EPOCHS = {"iggsa": 4}
LR = {"iarnn-word": 1e-2, "gru": 1e-2}


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


@pytest.fixture(scope="module")
def wikiqa_subset(shared_data):
    corpus = read_wikiqa(os.path.join(shared_data, "wikiqa"))
    train, dev = corpus.splits["train"].to_pylist(), corpus.splits["dev"].to_pylist()
    keep_train = sorted({r["qid"] for r in train})[:300]
    keep_dev = sorted({r["qid"] for r in dev})[:80]
    train = [r for r in train if r["qid"] in set(keep_train)]
    dev = [r for r in dev if r["qid"] in set(keep_dev)]
    vocab = {"<pad>": 0, "<unk>": 1, "<sep>": 2, "<cls>": 3}
    for r in train:
        for w in _words(r["question"]) + _words(r["answer"]):
            vocab.setdefault(w, len(vocab))

    def ids(rows):
        return {
            "qid": np.array([r["qid"] for r in rows]),
            "label": np.array([r["label"] for r in rows]),
            "question_ids": [[vocab.get(w, 1) for w in _words(r["question"])] for r in rows],
            "answer_ids": [[vocab.get(w, 1) for w in _words(r["answer"])] for r in rows],
        }

    return ids(train), ids(dev), len(vocab)


def _batches(data: dict, size: int, rng):
    """Questions in a random order, each question's candidates together, as the training loop's local shuffle
    of shards written in question order mostly leaves them (so pairwise models see the question's own
    negatives)."""
    questions = list(dict.fromkeys(data["qid"].tolist()))
    rank = {q: i for i, q in enumerate(rng.permutation(questions))}
    order = sorted(range(len(data["qid"])), key=lambda i: rank[data["qid"][i]])
    for start in range(0, len(order), size):
        rows = order[start : start + size]
        yield {
            "qid": data["qid"][rows],
            "label": data["label"][rows],
            "question_ids": [data["question_ids"][i] for i in rows],
            "answer_ids": [data["answer_ids"][i] for i in rows],
        }


def _dev_map(model, batcher, dev) -> float:
    model.eval()
    with torch.no_grad():
        scores = []
        for start in range(0, len(dev["qid"]), 256):
            chunk = {k: v[start : start + 256] for k, v in dev.items()}
            inputs, _ = batcher(chunk)
            scores.extend(model.score(model(**inputs)).tolist())
    model.train()
    return ranking_metrics(dev["qid"], dev["label"], scores)["map"]


def _random_map(dev) -> float:
    return random_ranking(per_question_ranking(dev["qid"], dev["label"], np.zeros(len(dev["qid"]))))["map"]


@pytest.mark.parametrize("name", ANSWER_SELECTION)
def test_trains_clearly_better_than_chance_on_wikiqa(name, wikiqa_subset):
    train, dev, vocab_size = wikiqa_subset
    fields = set(MODELS[name].config_class.__dataclass_fields__)
    cfg = TrainConfig(
        model=name,
        data="",
        max_len=48,
        seed=0,
        dim=48,
        dropout=0.0,
        model_overrides={k: v for k, v in SMALL.items() if k in fields and k != "dim"},
    )
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size)
    batcher = Batcher(cfg, model.inputs, getattr(model, "objective", None))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR.get(name, 3e-3))
    rng = np.random.default_rng(0)
    untrained = _dev_map(model, batcher, dev)
    losses = []
    for _ in range(EPOCHS.get(name, 2)):
        for batch in _batches(train, 32, rng):
            inputs, labels = batcher(batch, train=True)
            loss = model.loss(model(**inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    trained, chance = _dev_map(model, batcher, dev), _random_map(dev)
    print(
        f"{name}: dev MAP {trained:.3f} (untrained {untrained:.3f}) against chance {chance:.3f}; "
        f"loss {np.mean(losses[:10]):.3f} -> "
        f"{np.mean(losses[-10:]):.3f}"
    )
    assert trained > chance + GAP, f"{name}: dev MAP {trained:.3f}, chance {chance:.3f}"
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10]), f"{name}: training loss did not fall"


@pytest.fixture(scope="module")
def squad_subset(shared_data):
    """2,000 questions of SQuAD's dev half for training and its last 300 (other articles) held out, tokenised
    by the passage pipeline's own stages with a vocabulary of the training words seen twice."""
    import collections

    import pyarrow.compute as pc

    from pipelines.passages import OK, PassageIds, PassageTokenizer
    from pipelines.readers.passages import read_squad
    from pipelines.vocabulary import RESERVED

    table = read_squad(os.path.join(shared_data, "squad_sample", "dev-v1.1.du-split-dev-half.json.gz")).splits["dev"]
    tokenizer = PassageTokenizer()
    train, held = tokenizer(table.slice(0, 2000)), tokenizer(table.slice(table.num_rows - 300, 300))
    train, held = (t.filter(pc.equal(t["status"], OK)) for t in (train, held))
    counts = collections.Counter(
        w for column in ("question_tokens", "context_tokens") for row in train[column].to_pylist() for w in row
    )
    words = [w for w, c in counts.most_common() if c >= 2 and w not in RESERVED]
    chars = sorted({ch for w in counts for ch in w} - set(RESERVED))
    ids = PassageIds(list(RESERVED) + words, list(RESERVED) + chars, 16)
    return ids(train).to_pydict(), ids(held).to_pydict(), len(RESERVED) + len(words), len(RESERVED) + len(chars)


def _rows(data: dict, index) -> dict:
    return {k: [data[k][i] for i in index] for k in data}


def _reading(model, held: dict) -> dict:
    """Held-out answer likelihood (start + end NLL of every occurrence), its uniform-guess value, and EM/F1 of
    the best spans."""
    from qa_models.batching import passage_batch
    from qa_models.dynsan import _occurrence_nll
    from qa_models.metrics import reading_metrics

    model.eval()
    predictions, nll, uniform = [], 0.0, 0.0
    with torch.no_grad():
        for start in range(0, len(held["qid"]), 50):
            rows = _rows(held, range(start, min(start + 50, len(held["qid"]))))
            batch = passage_batch(rows)
            targets = batch.pop("targets")
            output = model(**batch)
            nll += float(
                _occurrence_nll(output["start"], targets["starts"]) + _occurrence_nll(output["end"], targets["ends"])
            ) * len(rows["qid"])
            # a uniform guess gives each occurrence 1/L: the likelihood of k occurrences is k/L
            uniform += sum(-2 * np.log(len(s) / len(c)) for s, c in zip(rows["answer_starts"], rows["context_ids"]))
            predictions += [
                " ".join(rows["context_tokens"][i][s : e + 1])
                for i, (s, e) in enumerate(model.best_spans(output).tolist())
            ]
    model.train()
    count = len(held["qid"])
    return {**reading_metrics(predictions, held["answers"]), "nll": nll / count, "uniform_nll": uniform / count}


def test_dynsan_learns_to_find_answers_in_squad_passages(squad_subset):
    from qa_models.batching import passage_batch
    from qa_models.dynsan import DynSAN, DynSANConfig

    train, held, vocab_size, char_vocab_size = squad_subset
    torch.manual_seed(0)
    model = DynSAN(
        DynSANConfig(
            vocab_size=vocab_size,
            char_vocab_size=char_vocab_size,
            word_dim=48,
            char_dim=8,
            char_filters=16,
            char_kernel=3,
            dim=48,
            heads=4,
            top_k=64,
            kernel=5,
            cross_blocks=1,
            max_passages=1,
            dropout=0.0,
            freeze_embeddings=False,
        )
    )
    before = _reading(model, held)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    order = np.random.default_rng(0).permutation(len(train["qid"]))
    for start in range(0, len(order), 16):
        batch = passage_batch(_rows(train, order[start : start + 16]))
        targets = batch.pop("targets")
        loss = model.loss(model(**batch), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = _reading(model, held)
    print(
        f"dynsan on held-out SQuAD: NLL {before['nll']:.2f} -> {after['nll']:.2f} "
        f"(uniform {after['uniform_nll']:.2f}), F1 {before['f1']:.3f} -> {after['f1']:.3f}, "
        f"EM {before['em']:.3f} -> {after['em']:.3f}"
    )
    # about e^1.2 = 3.3 times the likelihood here; span F1 after one short pass is noise (0.09-0.14 from 0.09-0.11
    # untrained over seeds and subsets), so exact matches are asserted only to appear
    assert after["nll"] < before["nll"] - 1.0 and after["nll"] < after["uniform_nll"] - 1.0
    assert after["em"] > before["em"]
