"""CTRN, the Cross Temporal Recurrent Network, and its QRNN baseline, for answer selection.

Tay, Tuan, Hui. "Cross Temporal Recurrent Networks for Ranking Question Answer Pairs", AAAI 2018. QRNN: Bradbury,
Merity, Xiong, Socher. "Quasi-Recurrent Neural Networks", ICLR 2017.

Embedding (fixed, pretrained) and a shared n x m projection; a quasi-recurrent layer of three width-k
convolutions per text (eq. 1)

    Z = tanh(W_z * X),  F = sigmoid(W_f * X),  O = sigmoid(W_o * X)

(causal, as QRNN's masked convolutions, so a step never sees padding after it); then per text two cells. The
CTRN-Q cells (CTRN-A mirrors them):

    c_t^q  = f_t^q  c_{t-1}^q  + (1 - f_t^q)  z_t^q,       h_t^q  = o_t^q  c_t^q
    c_t^q+ = f_t*^a c_{t-1}^q+ + (1 - f_t*^a) z_t^q,       h_t^q+ = o_t*^a c_t^q+

with the partner's gates taken at the aligned step t* = t * ceil(max(|q|, |a|) / min(|q|, |a|)) for the shorter
text; for the longer one we read the same mapping backwards, t* = floor(t / ceil(max / min)) (the paper gives
one formula for both, which would run off the end of the shorter text), clamped to its last step. The paper's
CTRN-A equation writes z_t*^a in the crossed cell; we use z_t^a, as its CTRN-Q equation does (the crossed cell
fuses the partner's gates into the text's own inputs). Hadamard merge h_t = h_t^s * h_t^s+, temporal mean
pooling over real steps, the two vectors concatenated through an MLP, and a 2-class softmax (eq. 2) trained
with cross-entropy (eq. 3; its L2 term lambda ||theta||^2 is the recipe's `l2`, added to the loss by the training
loop). `cross=False` is the QRNN baseline (h_t = o_t c_t, nothing crossed). `_cells` writes the cells with
`qa_models.scan.forget_mult` (GPU, half precision); on CPU in float32/float64 the activations, cells and mean
pooling of both texts run as one C kernel each way instead (`qa_models.scan.ctrn_cells`, tested against them),
and the gates' products are computed once per distinct word of the batch (`word_pre_activations`: eq. 1 is
linear in the fixed word vectors, so each of the k taps is a word's own term).

On TrecQA the paper concatenates "four word overlap features ... before the dense layers, following (Severyn and
Moschitti 2015)" (`overlap_features=True`): the share of shared words |Q & A| / (|Q| + |A|) and its IDF-weighted
form sum_{w in Q & A} idf(w) / (|Q| + |A|), over the sets of word ids of question and answer, once with every
word and once without stop words, as Severyn and Moschitti's released code computes them. The IDF of each word
(log of documents over documents holding it, every distinct question and answer of train a document) and the
stop-word list (spaCy's English) are buffers, filled from the training data before training
(`load_word_statistics`) and saved with the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from qa_models.encoders import word_embedding_table
from qa_models.matching import masked_mean
from qa_models.recipes import TrainingRecipe
from qa_models.scan import ctrn_cells, forget_mult, fused_cells_for, masked_forget

OVERLAP_FEATURES = 4
FIRST_WORD_ID = 4  # pipelines.vocabulary.RESERVED: <pad> <unk> <sep> <cls> are no words to share


@dataclass
class CTRNConfig:
    vocab_size: int = 30_000
    embed_dim: int = 300  # n: the pretrained embeddings (GloVe 300d in the paper), kept fixed
    dim: int = 256  # m: the projection; the paper tunes the filters d in [128, 1024]
    filters: int = 256  # d
    kernel: int = 2  # k, the convolution width
    mlp_layers: int = 1  # tuned in [1, 3]
    hidden: int = 256  # h, the MLP width
    dropout: float = 0.5
    cross: bool = True  # False: the QRNN baseline
    overlap_features: bool = False  # TrecQA: the four word-overlap features before the dense layers
    freeze_embeddings: bool = True
    pad_id: int = 0

    @classmethod
    def tiny(cls) -> CTRNConfig:
        return cls(vocab_size=64, embed_dim=12, dim=16, filters=16, kernel=2, mlp_layers=1, hidden=16, dropout=0.0)


PAPER_RECIPE = TrainingRecipe(
    optimizer="adam",
    lr=1e-3,
    l2=4e-6,
    schedule="constant",
    batch_size=64,
    epochs=25,
    patience=5,
    model_options={"dropout": 0.5},
    source='Tay et al. 2018, eq. 3: "lambda ||theta||_2^2 is the L2 regularization. The parameters of the network '
    'are updated using the Adam Optimizer"; Implementation Details: "learning rate tuned amongst {1e-3, '
    "1e-4, 1e-5}. Batch size is tuned amongst {64, 128, 256, 512}. Dropout is set to 0.5 and L2 "
    'regularization is set to 4x10^-6"; TrecQA: "We train our model for 25 epochs for TRAIN ... training '
    "is terminated if the validation performance doesn't improve after 5 epochs\"",
    ours="lr 1e-3 and batch 64 from the paper's grids (it does not report the tuned values); Adam's betas (0.9, "
    "0.999); no gradient clip",
    deviations="GloVe (d = 50 on TrecQA, 300 on YahooQA) is not available offline: fastText vectors trained on the "
    "data set itself (jobs/word_vectors.py), fixed as the paper's",
)


def overlap_features(
    q_ids: torch.Tensor,
    q_mask: torch.Tensor,
    a_ids: torch.Tensor,
    a_mask: torch.Tensor,
    idf: torch.Tensor,
    stopword: torch.Tensor,
) -> torch.Tensor:
    """Severyn and Moschitti's four word-overlap features (B, 4): overlap and IDF-weighted overlap over the sets of
    word ids, with all words, then without stop words. q_ids: (B, Lq), a_ids: (B, La) with their masks."""
    features = []
    for drop_stop in (False, True):
        q_word = q_mask & (q_ids >= FIRST_WORD_ID)  # (B, Lq)
        a_word = a_mask & (a_ids >= FIRST_WORD_ID)  # (B, La)
        if drop_stop:
            q_word, a_word = q_word & ~stopword[q_ids], a_word & ~stopword[a_ids]
        q_first = _first_occurrences(q_ids, q_word)  # (B, Lq): each distinct word once
        a_first = _first_occurrences(a_ids, a_word)  # (B, La)
        shared = q_first & ((q_ids[:, :, None] == a_ids[:, None, :]) & a_word[:, None, :]).any(-1)  # (B, Lq)
        sizes = (q_first.sum(1) + a_first.sum(1)).clamp_min(1).to(idf.dtype)  # |Q| + |A|: (B,)
        features += [shared.sum(1).to(idf.dtype) / sizes, (idf[q_ids] * shared).sum(1) / sizes]
    return torch.stack(features, -1)  # (B, 4)


def _first_occurrences(ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(B, L) True where a kept token's id is not among the kept tokens before it."""
    same = (ids[:, :, None] == ids[:, None, :]) & keep[:, None, :]  # (B, L, L): token j kept and equal to token i
    earlier = torch.ones(ids.size(1), ids.size(1), dtype=torch.bool, device=ids.device).tril(-1)  # j < i
    return keep & ~(same & earlier).any(-1)


def aligned_steps(own: torch.Tensor, partner: torch.Tensor, width: int) -> torch.Tensor:
    """Indices t* (B, width) into the partner's steps for each of a text's steps, from true lengths `own` and
    `partner` (B,): t * ratio when the text is the shorter one, t // ratio when it is the longer, ratio =
    ceil(max / min); clamped to the partner's last step."""
    own, partner = own.clamp_min(1), partner.clamp_min(1)
    ratio = torch.div(
        torch.maximum(own, partner) + torch.minimum(own, partner) - 1,
        torch.minimum(own, partner),
        rounding_mode="floor",
    )  # (B,) ceil(max / min)
    t = torch.arange(width, device=own.device)[None, :]  # (1, width)
    shorter = (own <= partner)[:, None]  # (B, 1)
    steps = torch.where(shorter, t * ratio[:, None], torch.div(t, ratio[:, None], rounding_mode="floor"))
    return torch.minimum(steps, (partner - 1)[:, None])  # (B, width)


class QuasiRecurrentGates(nn.Module):
    """Eq. 1: Z, F, O from one causal convolution of width k with 3d output channels.

    The convolution's weights are an nn.Conv1d's (checkpoints keep its layout), applied as three matrix products
    over the k shifted copies of x side by side: the same sums, without the channel-first transposes a Conv1d
    needs, and each of Z, F, O comes out contiguous in time-major order, as the recurrence reads them (oneDNN's
    backward of this thin convolution took 40% of CTRN's CPU step)."""

    def __init__(self, dim: int, filters: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.conv = nn.Conv1d(dim, 3 * filters, kernel)

    def _causal_window(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, L, c); tap j of the kernel reads x_{t-(k-1-j)}, zeros before the first step (causal)
        k, length = self.kernel, x.size(1)
        taps = [F.pad(x, (0, 0, k - 1 - j, 0))[:, :length] if j < k - 1 else x for j in range(k)]
        return torch.cat(taps, dim=-1) if k > 1 else x  # (B, L, k*c)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        window = self._causal_window(x)  # (B, L, k*m)
        weight = self.conv.weight.permute(0, 2, 1).reshape(self.conv.out_channels, -1)  # (3d, k*m), tap-major
        bias = self.conv.bias if self.conv.bias is not None else torch.zeros_like(weight[:, 0])
        z, f, o = (F.linear(window, w, b) for w, b in zip(weight.chunk(3), bias.chunk(3)))  # each (B, L, d)
        return torch.tanh(z), torch.sigmoid(f), torch.sigmoid(o)

    def word_pre_activations(
        self, texts: list[torch.Tensor], embed: nn.Embedding, project: nn.Linear
    ) -> list[torch.Tensor]:
        """The sums before tanh and sigmoid, one (B, L, 3d) tensor [z | f | o] per text of ids (B, L), computed
        once per distinct word of the batch and gathered to the steps. The convolution is linear in x = P e + b_p,
        so each tap's term W_j x_t = (W_j P) e_w + W_j b_p depends on the word w at step t - (k-1-j) alone: its
        products for the batch's U distinct words, (U, 3d) a tap, summed at each step over the k taps. The same
        function and gradients as the gates over the projected vectors, in about U / (B L) of the multiply-adds
        of their products (measured on WikiQA, batches of 64 pairs: a distinct word for every 6 positions), and
        without the projection's products at all. A tap that reaches before the first step reads zeros in x (not
        b_p): it gathers a row of zeros, and its W_j b_p is taken back from those first steps."""
        k, three_d = self.kernel, self.conv.out_channels
        distinct, inverse = torch.unique(torch.cat([ids.reshape(-1) for ids in texts]), return_inverse=True)
        vectors = embed(distinct)  # (U, n)
        per_tap = self.conv.weight.permute(2, 0, 1)  # (k, 3d, m): W_j
        tap_bias = per_tap @ project.bias  # (k, 3d): W_j b_p
        bias = tap_bias.sum(0) + (self.conv.bias if self.conv.bias is not None else 0)  # (3d,)
        nothing = vectors.new_zeros(1, three_d)  # the row a tap reaching before the first step gathers
        by_word = [torch.cat([F.linear(vectors, w @ project.weight), nothing]) for w in per_tap]  # k x (U+1, 3d)
        gates, start = [], 0
        for ids in texts:
            batch, length = ids.shape
            index = inverse[start : start + batch * length].view(batch, length)  # (B, L) rows of by_word
            start += batch * length
            summed = by_word[k - 1].index_select(0, index.reshape(-1))  # (B*L, 3d): the tap on x_t
            for j in range(k - 1):  # tap j reads x_{t-(k-1-j)}: the zero row before the first step
                shifted = F.pad(index, (k - 1 - j, 0), value=distinct.numel())[:, :length]  # (B, L)
                summed += by_word[j].index_select(0, shifted.reshape(-1))
            summed += bias
            summed = summed.view(batch, length, three_d)  # (B, L, 3d)
            for j in range(k - 1):  # tap j is missing at steps t < k-1-j
                summed[:, : k - 1 - j] -= tap_bias[j]
            gates.append(summed)
        return gates


class CTRN(nn.Module):
    config_class = CTRNConfig
    recipe = PAPER_RECIPE
    inputs = "separate"  # question and answer apart (qa_models.batching.separate_batch)
    idf: torch.Tensor  # buffers (with overlap features): the training data's IDF per word id, stop-word flags
    stopword: torch.Tensor

    def __init__(self, config: CTRNConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.embed = word_embedding_table(
            config.vocab_size, config.embed_dim, config.pad_id, embeddings, config.freeze_embeddings
        )
        self.project = nn.Linear(config.embed_dim, config.dim)  # shared by question and answer
        self.gates = QuasiRecurrentGates(config.dim, config.filters, config.kernel)  # shared, as in QRNN
        layers, width = [], 2 * config.filters + (OVERLAP_FEATURES if config.overlap_features else 0)
        if config.overlap_features:
            self.register_buffer("idf", torch.zeros(config.vocab_size))
            self.register_buffer("stopword", torch.zeros(config.vocab_size, dtype=torch.bool))
        for _ in range(config.mlp_layers):
            layers += [nn.Linear(width, config.hidden), nn.ReLU(), nn.Dropout(config.dropout)]
            width = config.hidden
        self.mlp = nn.Sequential(nn.Dropout(config.dropout), *layers)
        self.out = nn.Linear(width, 2)  # W_f, b_f of eq. 2

    def _cells(self, own, partner, mask, partner_mask) -> torch.Tensor:
        z, f, o = own
        h = o * forget_mult(masked_forget(f, mask), z)  # (B, L, d)
        if not self.config.cross:
            return h
        _, f_p, o_p = partner
        steps = aligned_steps(mask.sum(1), partner_mask.sum(1), z.size(1))  # (B, L)
        index = steps[..., None].expand(-1, -1, z.size(2))  # (B, L, d)
        f_x, o_x = f_p.gather(1, index), o_p.gather(1, index)  # partner gates at t*: (B, L, d)
        h_x = o_x * forget_mult(masked_forget(f_x, mask), z)  # (B, L, d)
        return h * h_x  # Hadamard merge

    def forward(
        self,
        question_ids: torch.Tensor,
        question_mask: torch.Tensor,
        answer_ids: torch.Tensor,
        answer_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (B, 2) for (B, Lq) question and (B, La) answer ids with their masks; softmax gives eq. 2."""
        q_mask, a_mask = question_mask.bool(), answer_mask.bool()
        fused = fused_cells_for(self.project.weight) is not None and not torch.is_autocast_enabled("cpu")
        if fused:  # CPU float32/float64: the gates per distinct word, then activations, cells and pooling in C
            q_len, a_len = q_mask.sum(1), a_mask.sum(1)
            gates_q, gates_a = self.gates.word_pre_activations([question_ids, answer_ids], self.embed, self.project)
            pooled_q, pooled_a = ctrn_cells(
                gates_q,  # (B, Lq, 3d)
                gates_a,  # (B, La, 3d)
                q_mask,
                a_mask,
                aligned_steps(q_len, a_len, question_ids.size(1)),
                aligned_steps(a_len, q_len, answer_ids.size(1)),
                self.config.cross,
            )  # (B, d) each
        else:
            e_q, e_a = self.embed(question_ids), self.embed(answer_ids)  # (B, L, n)
            q, a = self.gates(self.project(e_q)), self.gates(self.project(e_a))  # Z, F, O: (B, L, d) each
            pooled_q = masked_mean(self._cells(q, a, q_mask, a_mask), q_mask)  # (B, d): mean over real steps
            pooled_a = masked_mean(self._cells(a, q, a_mask, q_mask), a_mask)  # (B, d)
        x = torch.cat([pooled_q, pooled_a], dim=-1)  # (B, 2d)
        if self.config.overlap_features:
            features = overlap_features(question_ids, q_mask, answer_ids, a_mask, self.idf, self.stopword)
            x = torch.cat([x, features.to(x.dtype)], dim=-1)  # (B, 2d + 4)
        return self.out(self.mlp(x))

    @property
    def needs_word_statistics(self) -> bool:
        return self.config.overlap_features

    def load_word_statistics(self, idf, stopword) -> None:
        """The training data's IDF per word id (V,) and stop-word flags (V,), for the overlap features."""
        with torch.no_grad():
            self.idf.copy_(torch.as_tensor(idf, dtype=self.idf.dtype))
            self.stopword.copy_(torch.as_tensor(stopword, dtype=torch.bool))

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels.long())

    @staticmethod
    def score(logits: torch.Tensor) -> torch.Tensor:
        """The ranking score: the probability of the positive class."""
        return logits.softmax(-1)[:, 1]


@dataclass
class QRNNConfig(CTRNConfig):
    cross: bool = False

    @classmethod
    def tiny(cls) -> QRNNConfig:
        return cls(**{**CTRNConfig.tiny().__dict__, "cross": False})


class QRNN(CTRN):
    """The QRNN baseline of the CTRN paper's tables: the same network with nothing crossed."""

    config_class = QRNNConfig
