"""Training the nugget selector (Qin et al., sections 2.3-2.4), on a CPU, on small data.

The scorer is the paper's: a 2-layer feed-forward net over the hidden states of a lower layer
(layer 3) of the *frozen* model, one score per token. Selection (top-k) is not differentiable,
so training uses the straight-through estimator of eq. 18: the decoder attends to the selected
nuggets with ``s - StopGrad(s)`` added to their attention logits, which changes nothing in the
forward pass but sends to each score the gradient of every attention logit that reaches its
nugget from every later token in every layer (eq. 17).

Objective: language modelling from compressed context (the paper's section 2.2 objective with
the compressor of section 2.3): a chunk of ``context`` tokens is compressed to nuggets and the
model must predict the next ``continuation`` tokens from them. The model and its KV states stay
frozen; only the scorer learns (the paper's LoRA adapters on the decoder are left out).

The saved file carries the model it was trained for (hidden size, layer count, vocabulary
fingerprint), and ``load_selector`` refuses another model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import torch

from decodebench.kernels.nugget import gather_kv, select_topk, straight_through_bias

FORMAT = "decodebench-nugget-selector/1"


class NuggetScorer(torch.nn.Module):
    """Scorer_phi: Linear -> ReLU -> Linear(1) over layer ``layer``'s hidden states (appendix B.3)."""

    def __init__(self, hidden_size: int, layer: int = 3):
        super().__init__()
        self.layer = layer
        self.net = torch.nn.Sequential(
            torch.nn.Linear(hidden_size, hidden_size), torch.nn.ReLU(), torch.nn.Linear(hidden_size, 1)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden).squeeze(-1)


def _identity(model, tokenizer) -> dict:
    from decodebench.metrics.infinigram_index import tokenizer_fingerprint

    return {
        "hidden_size": model.config.hidden_size,
        "num_hidden_layers": model.config.num_hidden_layers,
        "vocabulary": tokenizer_fingerprint(tokenizer),
    }


def load_selector(path: str | Path, model, tokenizer) -> NuggetScorer:
    """A trained selector for this model; clear errors for a missing file or another model."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"selector={str(path)!r} is neither a built-in selector (delimiter, attention, streaming, truncation, "
            "full) nor an existing selector file (train one with `decodebench train-nugget`)"
        )
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("format") != FORMAT:
        raise ValueError(f"{path} is not a decodebench nugget selector (format {saved.get('format')!r})")
    expected = _identity(model, tokenizer)
    if saved["model"] != expected:
        raise ValueError(f"{path} was trained for another model ({saved['model']}); this model is {expected}")
    scorer = NuggetScorer(saved["model"]["hidden_size"], saved["layer"])
    scorer.load_state_dict(saved["state_dict"])
    return scorer.eval()


def _chunks(tokenizer, length: int, count: int, seed: int) -> list[list[int]]:
    from decodebench.metrics.infinigram_index import reference_corpus

    tokens = [t for doc in reference_corpus() for t in tokenizer(doc, add_special_tokens=False).input_ids]
    rng = random.Random(seed)
    starts = [rng.randrange(0, len(tokens) - length) for _ in range(count)]
    return [tokens[s : s + length] for s in starts]


def straight_through_loss(
    model, scorer: NuggetScorer, context: list[int], continuation: list[int], ratio: float
) -> torch.Tensor:
    """LM loss of ``continuation`` given the nuggets of ``context``, differentiable in the scores."""
    from transformers import DynamicCache

    n, m = len(context), len(continuation)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        encoded = model(
            input_ids=torch.tensor([context]), past_key_values=cache, use_cache=True, output_hidden_states=True
        )
    scores = scorer(encoded.hidden_states[scorer.layer][0])  # [n], requires grad
    indices, _ = select_topk(scores.detach()[None], torch.tensor([n]), ratio)
    nuggets = DynamicCache(ddp_cache_data=[gather_kv(layer.keys, layer.values, indices) for layer in cache.layers])
    k = indices.shape[1]
    # 4-D additive mask: every continuation token sees all nuggets (plus eq. 18's zero-valued bias
    # that carries the gradient) and the continuation causally
    causal = torch.full((m, m), float("-inf")).triu(1)
    bias = straight_through_bias(scores[indices[0]])[None, :].expand(m, k)
    mask = torch.cat([bias, causal], dim=1)[None, None]
    logits = (
        model(
            input_ids=torch.tensor([continuation]),
            past_key_values=nuggets,
            attention_mask=mask,
            position_ids=torch.arange(n, n + m)[None],
        )
        .logits[0]
        .float()
    )
    # the first continuation token is predicted from the context's own last position, not here
    return torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(continuation[1:]))


def train(
    model_path: str,
    out: str | Path,
    ratio: float | None = None,
    steps: int = 200,
    context: int = 160,
    continuation: int = 32,
    lr: float = 1e-3,
    layer: int = 3,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Path:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if ratio is None:
        from decodebench.models.nugget.config import NuggetConfig

        ratio = NuggetConfig.defaults().ratio
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    model.set_attn_implementation("eager")  # the bias must reach the attention logits as written
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if not 0 <= layer <= model.config.num_hidden_layers:
        raise ValueError(f"layer must be in 0..{model.config.num_hidden_layers}, got {layer}")
    scorer = NuggetScorer(model.config.hidden_size, layer)
    optimizer = torch.optim.Adam(scorer.parameters(), lr=lr)
    chunks = _chunks(tokenizer, context + continuation, steps, seed)
    losses = []
    for step, chunk in enumerate(tqdm(chunks, desc="train-nugget")):
        loss = straight_through_loss(model, scorer, chunk[:context], chunk[context:], ratio)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
        if (step + 1) % 50 == 0:
            log(f"step {step + 1}: mean loss of the last 50 steps {sum(losses[-50:]) / 50:.3f}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "format": FORMAT,
            "model": _identity(model, tokenizer),
            "layer": layer,
            "ratio": ratio,
            "steps": steps,
            "first_loss": losses[0],
            "final_loss": sum(losses[-20:]) / min(20, len(losses)),
            "state_dict": scorer.state_dict(),
        },
        out,
    )
    log(
        f"saved {out}: loss {losses[0]:.3f} -> {sum(losses[-20:]) / min(20, len(losses)):.3f} "
        f"(perplexity {math.exp(losses[0]):.1f} -> {math.exp(sum(losses[-20:]) / min(20, len(losses))):.1f})"
    )
    return out
