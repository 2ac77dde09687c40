"""Every registered model on its tiny() configuration: forward and backward on CPU, a finite gradient for every
trainable parameter, the same scores whatever padding follows the sequences, and the same model and scores
under the same seed."""

import pytest
import torch

from qa_models import MODELS


def _inputs(model, extra: int = 0, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def ids(length, cut):
        x = torch.randint(4, 64, (4, length), generator=g)
        mask = torch.ones(4, length, dtype=torch.bool)
        mask[1, cut:] = False
        x = x * mask
        pad = torch.zeros(4, extra, dtype=torch.long)
        return torch.cat([x, pad], 1), torch.cat([mask, pad.bool()], 1)

    if model.inputs == "passages":

        def with_chars(length, cut):
            x, mask = ids(length, cut)
            chars = torch.randint(1, 32, (4, length, 4), generator=g)
            chars = torch.cat([chars, torch.zeros(4, extra, 4, dtype=torch.long)], 1) * mask[..., None]
            return x, chars, mask

        q, q_chars, q_mask = with_chars(5, 3)
        c, c_chars, c_mask = with_chars(14, 9)
        passage = torch.tensor([[0] * 6 + [1] * 5 + [2] * 3] * 2 + [[0] * 4 + [1] * 5 + [0] * 5] * 2)
        passage = torch.cat([passage, torch.zeros(4, extra, dtype=torch.long)], 1) * c_mask
        return {
            "question_ids": q,
            "question_chars": q_chars,
            "question_mask": q_mask,
            "context_ids": c,
            "context_chars": c_chars,
            "context_mask": c_mask,
            "passage": passage,
        }
    if model.inputs == "joint":
        input_ids, attention_mask = ids(15, 9)
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    q, q_mask = ids(7, 4)
    a, a_mask = ids(13, 6)
    return {"question_ids": q, "question_mask": q_mask, "answer_ids": a, "answer_mask": a_mask}


def _scores(model, inputs) -> torch.Tensor:
    output = model(**inputs)
    if model.inputs == "passages":  # start and end logits of the real context tokens
        mask = inputs["context_mask"]
        return torch.cat([output["start"][mask], output["end"][mask], output["gate_l1"]])
    return model.score(output)


def _loss(model, inputs):
    if model.inputs == "passages":
        targets = {
            "starts": torch.tensor([[1, 3], [2, -1], [0, -1], [5, -1]]),
            "ends": torch.tensor([[2, 4], [2, -1], [1, -1], [6, -1]]),
        }
        return model.loss(model(**inputs), targets)
    if getattr(model, "objective", None) == "pairwise":
        negatives = {"negative_ids": inputs["answer_ids"].flip(0), "negative_mask": inputs["answer_mask"].flip(0)}
        return model.loss(model(**inputs, **negatives), torch.ones(4))
    return model.loss(model(**inputs), torch.tensor([1, 0, 1, 0]))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_backward_with_finite_gradients(name):
    torch.manual_seed(0)
    model = MODELS[name](MODELS[name].config_class.tiny())
    loss = _loss(model, _inputs(model))
    assert torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: {pname}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_padding_after_the_sequences_changes_no_score(name):
    torch.manual_seed(0)
    model = MODELS[name](MODELS[name].config_class.tiny()).eval()
    with torch.no_grad():
        scores = _scores(model, _inputs(model))
        padded = _scores(model, _inputs(model, extra=6))
    torch.testing.assert_close(scores, padded, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_same_seed_gives_the_same_model_and_scores(name):
    outputs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = MODELS[name](MODELS[name].config_class.tiny()).eval()
        with torch.no_grad():
            outputs.append(_scores(model, _inputs(model)))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
