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

    if model.inputs == "joint":
        input_ids, attention_mask = ids(15, 9)
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    q, q_mask = ids(7, 4)
    a, a_mask = ids(13, 6)
    return {"question_ids": q, "question_mask": q_mask, "answer_ids": a, "answer_mask": a_mask}


def _loss(model, inputs):
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
        scores = model.score(model(**_inputs(model)))
        padded = model.score(model(**_inputs(model, extra=6)))
    torch.testing.assert_close(scores, padded, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_same_seed_gives_the_same_model_and_scores(name):
    outputs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = MODELS[name](MODELS[name].config_class.tiny()).eval()
        with torch.no_grad():
            outputs.append(model.score(model(**_inputs(model))))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
