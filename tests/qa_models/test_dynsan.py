"""DynSAN: the DynSA block against attention over its chosen tokens computed by hand, equal to the block without
selection when K covers the sequence, memory linear in L, the passage split, both heads' likelihoods by hand,
padding invariance of the whole network, the character CNN and the local convolutions against their textbook
Conv1d forms; Bi-BloSA (Table 3 (g), (h)): its attention against loops by hand, each direction reading only its
side, blocks of padding left out, and the network built with it in place of the DynSA block."""

import pytest
import torch
import torch.nn.functional as F

from qa_models.dynsan import (
    BiBloSABlock,
    CharCNN,
    DepthwiseSeparableConv,
    DirectionalAttention,
    DynSABlock,
    DynSAN,
    DynSANConfig,
    MaskedBlockSelfAttention,
    _occurrence_nll,
    block_length,
    join_passages,
    split_passages,
)


def _block(select=True, top_k=4, seed=0):
    torch.manual_seed(seed)
    return DynSABlock(dim=8, heads=2, top_k=top_k, kernel=3, select=select).eval()


def test_with_k_at_least_the_length_selection_changes_nothing():
    x, mask = torch.randn(2, 9, 8), torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    selecting, plain = _block(top_k=9), _block(select=False)
    plain.load_state_dict(selecting.state_dict())
    torch.testing.assert_close(selecting(x, mask)[0], plain(x, mask)[0])
    longer = _block(top_k=50)
    longer.load_state_dict(selecting.state_dict())
    torch.testing.assert_close(longer(x, mask)[0], plain(x, mask)[0])


def test_attention_runs_among_the_k_chosen_tokens_only_and_unchosen_get_zeros():
    block = _block(top_k=3)
    x, mask = torch.randn(1, 10, 8), torch.ones(1, 10, dtype=torch.bool)
    mask[0, 8:] = False
    out, gate_l1 = block(x, mask)
    u = x
    for conv in block.local:
        u = conv(u, mask)
    hidden = torch.relu(block.hidden(u))
    gates = torch.sigmoid(block.gate(hidden))[0].T * mask[0]  # (H, L)
    f = block.transform(hidden)[0].view(10, 2, 4).transpose(0, 1)  # (H, L, d)
    q, k, v = block.qkv(u)[0].view(10, 3, 2, 4).permute(1, 2, 0, 3)  # each (H, L, d)
    z = torch.zeros(2, 10, 4)
    for h in range(2):
        chosen = gates[h, :8].topk(3).indices  # real tokens only
        attended = torch.zeros(10, 4)
        weights = torch.softmax(q[h, chosen] @ k[h, chosen].T / 2.0, -1)  # sqrt(D / H) = 2
        attended[chosen] = weights @ v[h, chosen]
        z[h] = (f[h] + attended) * (gates[h] / gates[h].max())[:, None]  # eq. 3
    expected = block.out(z.transpose(0, 1).reshape(10, 8)) + u[0]  # eq. 5
    torch.testing.assert_close(out[0, :8], expected[:8])
    assert (out[0, 8:] == 0).all()
    torch.testing.assert_close(gate_l1[0], gates.sum())


def _saved_bytes(block, length):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    x = torch.randn(1, length, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, torch.ones(1, length, dtype=torch.bool))[0].sum()
    return total


def test_memory_grows_linearly_in_the_length_with_selection_and_quadratically_without():
    selecting, plain = _block(top_k=16), _block(select=False)
    linear = _saved_bytes(selecting, 2048) / _saved_bytes(selecting, 1024)
    quadratic = _saved_bytes(plain, 2048) / _saved_bytes(plain, 1024)
    assert linear < 2.2 and quadratic > 3.0, (linear, quadratic)


def test_split_and_join_passages_round_trip():
    x = torch.arange(2 * 7, dtype=torch.float32).view(2, 7, 1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    passage = torch.tensor([[0, 0, 1, 1, 1, 2, 0], [0, 1, 1, 1, 0, 0, 0]])
    flat, flat_mask, where, owner = split_passages(x, passage, mask, passages=3)
    assert flat.shape == (5, 3, 1)  # a row for each passage with tokens: the second question has two
    assert flat[0, :2, 0].tolist() == [0.0, 1.0] and flat[1, :, 0].tolist() == [2.0, 3.0, 4.0]
    assert flat_mask.sum(1).tolist() == [2, 3, 1, 1, 3] and owner.tolist() == [0, 0, 0, 1, 1]
    torch.testing.assert_close(join_passages(flat, where, mask), x * mask[..., None])
    empty = torch.zeros_like(mask)
    flat, _, where, owner = split_passages(x, passage, empty, passages=3)
    assert flat.shape[0] == 0 and owner.numel() == 0
    assert join_passages(flat, where, empty).abs().sum() == 0


def test_heads_likelihoods_by_hand():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    nll = _occurrence_nll(logits, torch.tensor([[1, 3, -1]]))  # two occurrences: p = 0.2 + 0.4
    assert nll.item() == pytest.approx(-torch.log(torch.tensor(0.6)).item())
    model = DynSAN(DynSANConfig(**{**DynSANConfig.tiny().__dict__, "task": "multiple_choice"}))
    output = {"tokens": logits, "gate_l1": torch.zeros(1)}
    mentions = torch.tensor([[0, -1, 1, 0]])  # candidate 0 at tokens 0 and 3, candidate 1 at token 2
    log_p = model.candidate_log_probs(output, mentions, candidates=3)
    torch.testing.assert_close(log_p.exp(), torch.tensor([[0.5, 0.3, 0.0]]))
    loss = model.loss(output, {"mentions": mentions, "answer": torch.tensor([1])})
    assert loss.item() == pytest.approx(-torch.log(torch.tensor(0.3)).item())
    # a row whose answer was cut off with the context adds nothing, rather than an infinite loss
    two = torch.cat([logits, logits])
    assert _occurrence_nll(two, torch.tensor([[1, 3, -1], [-1, -1, -1]])).item() == pytest.approx(nll.item())
    assert _occurrence_nll(logits, torch.tensor([[-1]])).item() == 0.0
    loss = model.loss(
        {"tokens": two, "gate_l1": torch.zeros(2)},
        {"mentions": torch.cat([mentions, torch.full((1, 4), -1)]), "answer": torch.tensor([1, 1])},
    )
    assert loss.item() == pytest.approx(-torch.log(torch.tensor(0.3)).item())


def test_passage_batch_numbers_passages_and_keeps_answers_within_the_context():
    from qa_models.batching import passage_batch

    rows = {
        "question_ids": [[5, 6], [7]],
        "question_char_ids": [[[1, 2], [3]], [[4, 5, 6]]],
        "context_ids": [[8, 9, 10, 11, 12], [13, 14, 15]],
        "context_char_ids": [[[1], [2], [3], [4], [5, 6]], [[7], [8], [9]]],
        "passage_starts": [[0, 2, 4], [0]],
        "answer_starts": [[1, 4], [2]],
        "answer_ends": [[2, 4], [2]],
        "mention_starts": [[], [0, 2]],
        "mention_ends": [[], [1, 2]],
        "mention_candidates": [[], [1, 0]],
        "answer_index": [-1, 0],
    }
    batch = passage_batch(rows, max_context=4)
    assert batch["context_ids"].tolist() == [[8, 9, 10, 11], [13, 14, 15, 0]]
    assert batch["context_mask"].tolist() == [[True] * 4, [True] * 3 + [False]]
    assert batch["passage"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]
    assert batch["question_chars"].shape == (2, 2, 3) and batch["question_chars"][1, 0].tolist() == [4, 5, 6]
    assert batch["context_chars"].shape == (2, 4, 1)  # the two-character token fell past the cut
    targets = batch["targets"]
    assert targets["starts"].tolist() == [[1], [2]] and targets["ends"].tolist() == [[2], [2]]  # (4, 4) was cut
    assert targets["mentions"].tolist() == [[-1] * 4, [1, 1, 0, -1]] and targets["answer"].tolist() == [-1, 0]
    model = DynSAN(DynSANConfig.tiny())
    targets = batch.pop("targets")
    output = model(**batch)
    assert torch.isfinite(model.loss(output, targets))


def test_best_span_is_ordered_and_no_longer_than_the_cap():
    config = DynSANConfig(**{**DynSANConfig.tiny().__dict__, "max_answer_tokens": 2})
    model = DynSAN(config)
    start = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1]]))
    end = torch.log(torch.tensor([[0.05, 0.05, 0.1, 0.8]]))
    assert model.best_spans({"start": start, "end": end}).tolist() == [[2, 3]]  # (0, 3) is 4 tokens long
    config.max_answer_tokens = 4
    assert model.best_spans({"start": start, "end": end}).tolist() == [[0, 3]]


def _passage_batch(extra_q=0, extra_c=0):
    g = torch.Generator().manual_seed(0)
    q = torch.randint(4, 64, (2, 5), generator=g)
    q_chars = torch.randint(1, 32, (2, 5, 4), generator=g)
    c = torch.randint(4, 64, (2, 14), generator=g)
    c_chars = torch.randint(1, 32, (2, 14, 4), generator=g)
    q_mask, c_mask = torch.ones(2, 5, dtype=torch.bool), torch.ones(2, 14, dtype=torch.bool)
    q_mask[1, 3:], c_mask[1, 9:] = False, False
    passage = torch.tensor([[0] * 6 + [1] * 5 + [2] * 3, [0] * 4 + [1] * 5 + [0] * 5])

    def pad(t, n):
        return torch.cat([t, t.new_zeros(t.size(0), n, *t.shape[2:])], 1)

    return (
        pad(q * q_mask, extra_q),
        pad(q_chars * q_mask[..., None], extra_q),
        pad(q_mask, extra_q),
        pad(c * c_mask, extra_c),
        pad(c_chars * c_mask[..., None], extra_c),
        pad(c_mask, extra_c),
        pad(passage * c_mask, extra_c),
    )


@pytest.mark.parametrize("block", ["dynsa", "biblosa"])
@pytest.mark.parametrize("task", ["extractive", "multiple_choice"])
def test_the_network_is_padding_invariant(task, block):
    torch.manual_seed(0)
    model = DynSAN(DynSANConfig(**{**DynSANConfig.tiny().__dict__, "task": task, "block": block})).eval()
    with torch.no_grad():
        plain, padded = model(*_passage_batch()), model(*_passage_batch(extra_q=3, extra_c=6))
    mask = _passage_batch()[5]
    for key in ("start", "end") if task == "extractive" else ("tokens",):
        torch.testing.assert_close(plain[key][mask], padded[key][:, :14][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain["gate_l1"], padded["gate_l1"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("select", [True, False])
def test_the_fused_attention_path_equals_the_textbook_one(select):
    textbook = _block(select=select, top_k=4)
    fused = DynSABlock(dim=8, heads=2, top_k=4, kernel=3, select=select, sdpa=True).eval()
    fused.load_state_dict(textbook.state_dict())
    x, mask = torch.randn(2, 11, 8), torch.ones(2, 11, dtype=torch.bool)
    mask[1, 3:] = False
    torch.testing.assert_close(fused(x, mask)[0], textbook(x, mask)[0], atol=1e-5, rtol=1e-5)


def test_table_3_ablations_change_what_they_say_and_train():
    """Each of Table 3's switches builds, runs forward and backward, and changes the block's output; (b) has no
    attention parameters; (d) random selection differs from the gate's choice only when K < L."""
    torch.manual_seed(0)
    x, mask = torch.randn(2, 12, 8), torch.ones(2, 12, dtype=torch.bool)
    full = DynSABlock(dim=8, heads=2, top_k=4, kernel=3).eval()
    variants = {
        "no_attention": {"self_attention": False},
        "no_convolutions": {"convolutions": False},
        "random": {"selection": "random"},
        "random_ungated": {"selection": "random", "gate": False},
    }
    for name, options in variants.items():
        block = DynSABlock(dim=8, heads=2, top_k=4, kernel=3, **options).eval()
        block.load_state_dict(full.state_dict(), strict=False)
        y, gate_l1 = block(x, mask)
        assert not torch.allclose(y, full(x, mask)[0]), name
        (y.sum() + gate_l1.sum()).backward()
        assert all(p.grad is not None for p in block.parameters()), name
    assert DynSABlock(dim=8, heads=2, top_k=4, kernel=3, self_attention=False).qkv is None
    covering_random = DynSABlock(dim=8, heads=2, top_k=12, kernel=3, selection="random").eval()
    covering_gate = DynSABlock(dim=8, heads=2, top_k=12, kernel=3).eval()
    covering_random.load_state_dict(full.state_dict())
    covering_gate.load_state_dict(full.state_dict())
    torch.testing.assert_close(covering_random(x, mask)[0], covering_gate(x, mask)[0])
    with pytest.raises(ValueError, match="selection"):
        DynSABlock(dim=8, heads=2, top_k=4, kernel=3, selection="best")
    config = DynSANConfig.tiny()
    for options in variants.values():
        model = DynSAN(DynSANConfig(**{**config.__dict__, **options}))
        assert model.encode_block.gated == options.get("gate", True)


def _same_with_gradients(ours, textbook, inputs, modules):
    torch.testing.assert_close(ours(), textbook(), rtol=1e-5, atol=1e-6)
    grads = []
    for forward in (ours, textbook):
        for m in modules:
            m.zero_grad()
        for x in inputs:
            x.grad = None
        (forward() * torch.linspace(-1, 1, forward().numel()).view_as(forward())).sum().backward()
        grads.append([p.grad.clone() for m in modules for p in m.parameters()] + [x.grad.clone() for x in inputs])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_character_cnn_is_kims_convolution_relu_and_max_over_real_characters():
    """CharCNN computes its convolution as a matrix product over windows with the ReLU after the max; the
    textbook form (Conv1d, ReLU, max over the word's characters, padding characters left out) gives the same
    vectors and gradients, words of no characters (padding tokens) give zeros."""
    torch.manual_seed(0)
    cnn = CharCNN(chars=20, dim=4, filters=6, kernel=3)
    ids = torch.randint(1, 20, (2, 5, 7))
    ids[0, 1, 3:] = 0  # a short word
    ids[1, 4] = 0  # a padding token
    ids[1, 2, 1:] = 0  # a one-character word

    def textbook():
        x = cnn.embed(ids.reshape(-1, 7)).transpose(1, 2)  # (words, c, C)
        h = torch.relu(cnn.conv(x)).masked_fill(ids.reshape(-1, 1, 7) == 0, float("-inf"))
        return h.amax(-1).nan_to_num(0.0, neginf=0.0).view(2, 5, -1)

    _same_with_gradients(lambda: cnn(ids), textbook, [], [cnn])
    assert cnn(ids)[1, 4].abs().sum() == 0
    with pytest.raises(ValueError, match="odd"):
        CharCNN(chars=20, dim=4, filters=6, kernel=4)


def test_the_local_convolution_is_depthwise_then_pointwise_conv1d_over_zeroed_padding():
    torch.manual_seed(0)
    conv = DepthwiseSeparableConv(dim=6, kernel=5)
    x = torch.randn(2, 9, 6, requires_grad=True)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False

    def textbook():
        h = (conv.norm(x) * mask[..., None]).transpose(1, 2)  # (B, D, L)
        return x + F.relu(conv.pointwise(conv.depthwise(h))).transpose(1, 2)

    _same_with_gradients(lambda: conv(x, mask), textbook, [x], [conv])


def test_bi_blosa_blocks_are_the_cube_root_of_twice_the_length():
    # the authors' ceil((2L)^(1/3)): 400 tokens in blocks of 10 (2L = 800, 9^3 = 729), 4 in blocks of 2
    assert [block_length(n) for n in (1, 4, 13, 14, 400, 500, 4096)] == [2, 2, 3, 4, 10, 10, 21]


def test_directional_attention_by_hand():
    """DiSA: per feature, softmax over the positions a position may read of 5 tanh((W1 h_j + W2 h_i + b) / 5),
    the reading fused with h_i by a gate; forward reads j < i, backward j > i; the first position (forward) reads
    nothing, so its output is its gated mapping alone."""
    torch.manual_seed(0)
    x, mask = torch.randn(2, 5, 4), torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    for direction in ("forward", "backward"):
        disa = DirectionalAttention(4, direction).eval()
        with torch.no_grad():
            got = disa(x, mask)
            for b in range(2):
                for i in range(5):
                    h = F.elu(disa.map(x[b]))  # (N, D)
                    readable = [j for j in range(5) if mask[b, j] and (j < i if direction == "forward" else j > i)]
                    read = torch.zeros(4)
                    if readable:
                        f = torch.stack(
                            [5 * torch.tanh((disa.dependent(h[j]) + disa.head(h[i]) + disa.bias) / 5) for j in readable]
                        )
                        read = (torch.softmax(f, 0) * h[readable]).sum(0)
                    gate = torch.sigmoid(disa.fuse_mapped(h[i]) + disa.fuse_read(read))
                    want = (gate * h[i] + (1 - gate) * read) if mask[b, i] else torch.zeros(4)
                    torch.testing.assert_close(got[b, i], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_masked_block_attention_reads_only_its_side(direction):
    """A position's output in one direction changes with the tokens of the blocks on its side (through their
    summaries) and never with those of the blocks on the other side. Within its own block it may: the block's
    context E_b fuses the block's own summary, as DiSA's output keeps each position's own mapping."""
    torch.manual_seed(0)
    attention = MaskedBlockSelfAttention(6, 4, direction).eval()
    x, mask = torch.randn(1, 11, 6), torch.ones(1, 11, dtype=torch.bool)
    with torch.no_grad():
        base = attention(x, mask, 3)
        # the middle of blocks 0, 1 and 2: a block's summary is of its intra-block readings, and a block's first
        # token (backward) or last (forward) is read by none of them
        for j in (1, 4, 7):
            changed = x.clone()
            changed[0, j] += 1.0
            moved = (attention(changed, mask, 3) - base).abs().amax(-1)[0]  # (L,)
            first, last = 3 * (j // 3), 3 * (j // 3) + 2  # j's block
            before, after = moved[:first], moved[last + 1 :]
            same, differ = (after, before) if direction == "backward" else (before, after)
            assert torch.all(same == 0), (j, same)
            assert torch.all(differ > 0), (j, differ)
            if direction == "forward":  # within the block, the positions after j read it
                assert torch.all(moved[j + 1 : last + 1] > 0)


def test_bi_blosa_leaves_padding_and_blocks_of_padding_out():
    torch.manual_seed(0)
    block = BiBloSABlock(6, 3, convolutions=True).eval()
    x = torch.randn(1, 7, 6)
    with torch.no_grad():
        alone = block(x, torch.ones(1, 7, dtype=torch.bool))[0]
        padded_x = torch.cat([x, torch.randn(1, 9, 6)], 1)  # 16 tokens: garbage in the padding, three blocks of it
        mask = torch.tensor([[True] * 7 + [False] * 9])
        longer = torch.cat([padded_x, torch.randn(1, 16, 6)], 0)
        longer_mask = torch.cat([mask, torch.ones(1, 16, dtype=torch.bool)], 0)
        padded, gate_l1 = block(padded_x, mask)
    torch.testing.assert_close(padded[:, :7], alone, atol=1e-5, rtol=1e-5)  # r = 3 in both: the longest row is 7
    assert torch.all(padded[:, 7:] == 0) and torch.all(gate_l1 == 0)
    # batched with a longer row the blocks follow that row (r = 4), as the authors' padded length does
    with torch.no_grad():
        batched = block(longer, longer_mask)[0]
    assert block_length(16) == 4 and not torch.allclose(batched[0, :7], alone[0], atol=1e-4)


def test_bi_blosa_holds_about_the_dynsa_blocks_parameters():
    # Table 4 sizes DynSAN and Bi-BloSAN alike (1.9M each): each direction in D/2 features, at the paper's width
    def count(module):
        return sum(p.numel() for p in module.parameters())

    dynsa = count(DynSABlock(128, 8, 32, 7))  # its two convolutions included
    assert (dynsa, count(BiBloSABlock(128, 7)), count(BiBloSABlock(128, 7, convolutions=True))) == (
        135_432,
        148_608,  # (g)
        183_936,  # (h): the same two convolutions, 35,328
    )
    assert BiBloSABlock(128, 7).forward_attention.map.out_features == 64


def test_table_3_g_and_h_put_bi_blosa_in_every_block_and_train():
    """(g) Bi-BloSA in place of every DynSA block, (h) with the local convolutions before it: the network builds,
    runs forward and backward with a gradient for every parameter, and adds no gate L1; the DynSA block's own
    switches do not combine with it."""
    config = DynSANConfig.tiny()
    for convolutions in (False, True):
        torch.manual_seed(0)
        model = DynSAN(DynSANConfig(**{**config.__dict__, "block": "biblosa", "convolutions": convolutions}))
        blocks = [model.encode_block, model.model_block, *model.cross]
        assert all(isinstance(b, BiBloSABlock) and len(b.local) == (2 if convolutions else 0) for b in blocks)
        output = model(*_passage_batch())
        assert torch.all(output["gate_l1"] == 0)
        targets = {"starts": torch.tensor([[2, -1], [1, -1]]), "ends": torch.tensor([[3, -1], [2, -1]])}
        model.loss(output, targets).backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    for options in ({"selection": "random"}, {"gate": False}, {"self_attention": False}):
        with pytest.raises(ValueError, match="biblosa"):
            DynSAN(DynSANConfig(**{**config.__dict__, "block": "biblosa", **options}))
    with pytest.raises(ValueError, match="block"):
        DynSAN(DynSANConfig(**{**config.__dict__, "block": "blosa"}))
