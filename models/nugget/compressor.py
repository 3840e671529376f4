"""The paper's compressor (Qin et al., "Dynamic contextual compression", section 2.3), shared by
training (training.py) and decoding (method.py).

- ``NuggetScorer``: Scorer_phi, a 2-layer feed-forward net over the hidden states of layer
  ``iota = 3`` of the *frozen* model (appendix B.3; the adapters are off for these features);
- ``layer_hidden_states``: those features, running only the layers below ``iota``; ``LayerScores``: the same
  features read from the encoding pass instead, where that pass is the frozen model's (no encoder adapter);
- ``NuggetAdapters``: the two LoRA adapters of rank 32 (peft, through transformers' adapter
  integration): ``encoder`` (phi) builds the nuggets' states, ``decoder`` (theta) reads them and
  decodes; plus the soft token that sits between the nuggets and what follows them;
- ``encode_nuggets``: one compression step: score, ``TopK`` (eqs. 14-15, the last token always
  kept), encode with the encoder adapter, keep the chosen positions of every layer's cache;
- ``reading`` and ``after_nuggets``: how nuggets are read (the decoder adapter on, or the frozen
  model; the soft token in front of the text that follows them, at positions from n), the same in
  decoding a batch (method.py) and in the studies (``feed_after_nuggets``, one row);
- ``stack_nuggets``: the nuggets of a batch's rows in one cache, left-padded, and their mask;
- ``nugget_attention_mask``: the decoder's additive mask over [nuggets; soft token; text], which
  carries eq. 18's straight-through term ``s - StopGrad(s)`` on the nugget columns when training.

Scoring and encoding take a batch of right-padded rows (training steps several windows in one forward pass);
decoding compresses each row on its own.

Which projections the adapters wrap is not in the paper; rank 32 on three of the four attention
projections of LLaMA-7B gives exactly its 25.2M parameters per adapter (table 5). The shipped
checkpoints wrap ``q_proj``, ``k_proj`` and ``v_proj``; the authors' training code wraps ``q_proj``,
``v_proj`` and ``o_proj`` (``train-nugget --recipe authors``): with grouped-query attention a
nugget's keys and values are shared by several heads, and ``o_proj`` changes what each head writes back.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from decodebench.kernels.nugget import gather_kv, select_topk, straight_through_bias
from decodebench.models.nugget.training_settings import LORA_RANK, SCORER_LAYER

LORA_TARGETS = ("q_proj", "k_proj", "v_proj")
ADAPTERS = ("encoder", "decoder")


class NuggetScorer(torch.nn.Module):
    """Scorer_phi: Linear -> ReLU -> Linear(1) over layer ``layer``'s hidden states (appendix B.3).

    With ``feature_norm`` those states pass through the model's final norm first, as in the authors' library (its
    scorer reads the last hidden state of a copy of the model cut after ``layer`` layers, where transformers applies
    the final RMSNorm): on SmolLM2 layer 3's raw states span two orders of magnitude in norm (the first token's
    810 against a median of 77)."""

    def __init__(self, hidden_size: int, layer: int = SCORER_LAYER, feature_norm: bool = False):
        super().__init__()
        self.layer, self.feature_norm = layer, feature_norm
        self.net = torch.nn.Sequential(
            torch.nn.Linear(hidden_size, hidden_size), torch.nn.ReLU(), torch.nn.Linear(hidden_size, 1)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden).squeeze(-1)

    def score(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        """Scores [n] of ``input_ids`` [1, n] from the frozen model's features, in the scorer's dtype."""
        return self.score_batch(model, input_ids)[0]

    def score_batch(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores [B, n] of the rows of ``input_ids`` [B, n] (right-padded, ``attention_mask`` [B, n] marking the
        real tokens; a pad's score means nothing)."""
        return self.score_hidden(model, layer_hidden_states(model, input_ids, self.layer, attention_mask))

    def score_hidden(self, model, hidden: torch.Tensor) -> torch.Tensor:
        """Scores [B, n] of the frozen model's hidden states [B, n, d] after ``self.layer`` layers, however they
        were computed (a pass of their own, or the encoding pass: ``LayerScores``)."""
        if self.feature_norm:
            with torch.no_grad():
                hidden = final_norm(model)(hidden)
        return self(hidden.to(self.net[0].weight.dtype))


@dataclass(frozen=True)
class LayerScores:
    """Scores still to be computed from the hidden states after ``layer`` decoder layers of the frozen model:
    ``encode_nuggets`` reads them from its own pass over the document, when that pass is the frozen model's too,
    instead of a pass of their own (a scorer on layer 12 of 30 would otherwise add 12 layers to the prefill)."""

    layer: int
    from_hidden: Callable[[torch.Tensor], torch.Tensor]  # hidden [B, n, d] -> scores [B, n]


def final_norm(model) -> torch.nn.Module:
    """The decoder's final norm, which a ``feature_norm`` scorer reads its layer through."""
    norm = getattr(model.get_decoder(), "norm", None)
    if norm is None:
        raise ValueError(f"feature_norm needs the model's final norm; {type(model).__name__} has no `norm`")
    return norm


class _StopForward(Exception):
    def __init__(self, hidden: torch.Tensor):
        self.hidden = hidden


def decoder_layers(model) -> torch.nn.ModuleList:
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"nugget compression needs a decoder with a `layers` list; {type(model).__name__} has none")
    return layers


def layer_output(output) -> torch.Tensor:
    """The hidden states a decoder layer (or the embeddings) returned: some layers return a tuple, states first."""
    return output[0] if isinstance(output, tuple) else output


@torch.no_grad()
def layer_hidden_states(
    model, input_ids: torch.Tensor, layer: int, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Hidden states [B, n, d] of ``input_ids`` [B, n] after ``layer`` decoder layers (transformers'
    ``hidden_states[layer]``; 0 is the embeddings) of the model without adapters, computing no layer above it."""
    if layer == 0:
        return model.get_input_embeddings()(input_ids)

    def stop(module, args, output):
        raise _StopForward(layer_output(output))

    handle = decoder_layers(model)[layer - 1].register_forward_hook(stop)
    adapters = NuggetAdapters.attached(model)
    try:
        with adapters.disabled() if adapters else contextlib.nullcontext():
            model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    except _StopForward as stopped:
        return stopped.hidden
    finally:
        handle.remove()
    raise RuntimeError(f"layer {layer} was never reached")


@contextlib.contextmanager
def read_layer(model, layer: int):
    """Within it, a forward pass leaves in the yielded list the hidden states [B, n, d] after ``layer`` decoder
    layers (transformers' ``hidden_states[layer]``, as ``layer_hidden_states`` computes them)."""
    captured: list[torch.Tensor] = []
    module = model.get_input_embeddings() if layer == 0 else decoder_layers(model)[layer - 1]
    handle = module.register_forward_hook(lambda module, args, output: captured.append(layer_output(output)))
    try:
        yield captured
    finally:
        handle.remove()


def missing_modules(model, targets) -> list[str]:
    """The adapter targets (module names, as peft matches them) that ``model`` has no module of."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    return sorted(set(targets) - names)


def projections(model) -> list[str]:
    """The names of ``model``'s projections, to say what an adapter could wrap."""
    return sorted({name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name.endswith("_proj")})[:8]


class NuggetAdapters:
    """The encoder and decoder LoRA adapters and the soft token, attached to one model."""

    def __init__(
        self, model, rank: int = LORA_RANK, alpha: float | None = None, targets=LORA_TARGETS, dropout: float = 0.0
    ):
        from peft import LoraConfig

        self.model = model
        self.rank, self.alpha, self.targets = rank, float(alpha if alpha is not None else rank), tuple(targets)
        for name in ADAPTERS:  # dropout acts only while the model is in training mode
            config = LoraConfig(r=rank, lora_alpha=self.alpha, target_modules=list(self.targets), lora_dropout=dropout)
            with warnings.catch_warnings():  # two adapters on one model is the point here
                warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
                model.add_adapter(config, adapter_name=name)
        self.soft_token = torch.nn.Parameter(model.get_input_embeddings().weight.mean(dim=0).detach().clone())
        model._decodebench_nugget_adapters = self

    @staticmethod
    def attached(model) -> NuggetAdapters | None:
        return getattr(model, "_decodebench_nugget_adapters", None)

    def describe(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    def parameters(self, adapter: str) -> list[torch.nn.Parameter]:
        return [p for name, p in self.model.named_parameters() if "lora_" in name and f".{adapter}." in name]

    def use(self, adapter: str, trainable: bool = False) -> None:
        """Switch the active adapter (peft marks only the active one trainable; training wants both)."""
        self.model.set_adapter(adapter)
        for name in ADAPTERS:
            for parameter in self.parameters(name):
                parameter.requires_grad_(trainable)

    @contextlib.contextmanager
    def disabled(self):
        self.model.disable_adapters()
        try:
            yield
        finally:
            self.model.enable_adapters()

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {"soft_token": self.soft_token.detach().cpu()}
        for name in ADAPTERS:
            for key, value in self.model.get_adapter_state_dict(name).items():
                out[f"{name}.{key}"] = value.detach().cpu()
        return out

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        for name in ADAPTERS:
            prefix = f"{name}."
            own = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
            set_peft_model_state_dict(self.model, own, adapter_name=name)
        with torch.no_grad():
            self.soft_token.copy_(tensors["soft_token"])


def chat_template_parts(tokenizer) -> tuple[str, str] | None:
    """What the tokenizer's chat template writes before and after a user turn's text (the generation prompt
    included), or None without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "\x00"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True
    )
    opening, closing = rendered.split(marker)
    return opening, closing


@dataclass
class Nuggets:
    """The compressed documents: every layer's cache at the kept positions, and what was kept."""

    cache: object  # transformers DynamicCache holding k_max positions per row and layer
    indices: torch.Tensor  # [B, k_max] kept positions, in text order (a row's unused slots last)
    mask: torch.Tensor  # [B, k_max] which slots hold a row's nugget (rows keep different numbers)
    full_kv_bytes: int


def cache_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def encode_nuggets(
    model,
    documents: torch.Tensor,
    scores: torch.Tensor | LayerScores,
    ratio: float,
    encoder: bool,
    kept_whole: int | torch.Tensor = 0,
    lengths: torch.Tensor | None = None,
) -> Nuggets:
    """Encode ``documents`` [B, n] (with the encoder adapter when ``encoder``) and keep ``ceil(n / ratio)``
    positions of every layer of each row, chosen by ``scores`` [B, n] ([n] for one row; eqs. 14-15), or by the
    ``LayerScores`` of this pass's own hidden states (the frozen model's: not with ``encoder``); with
    ``kept_whole = w`` (an int or [B]), a row's first ``w`` tokens (the prompt's opening) are kept as they are and the
    ratio applies to the other ``n - w``. Rows shorter than ``n`` are right-padded, their ``lengths`` [B] given."""
    from transformers import DynamicCache

    if isinstance(scores, LayerScores) and encoder:
        raise ValueError("LayerScores read the frozen model's states, which the encoder adapter changes")
    batch, n = documents.shape
    device = documents.device
    present = None if lengths is None else (torch.arange(n, device=device)[None] < lengths[:, None]).long()
    lengths = torch.full((batch,), n, device=device) if lengths is None else lengths
    whole = torch.as_tensor(kept_whole, device=device).expand(batch)
    cache = DynamicCache(config=model.config)
    adapters = NuggetAdapters.attached(model)
    if encoder:
        adapters.use("encoder", trainable=torch.is_grad_enabled())
    with (
        adapters.disabled() if adapters and not encoder else contextlib.nullcontext(),
        read_layer(model, scores.layer) if isinstance(scores, LayerScores) else contextlib.nullcontext() as hidden,
    ):
        model(input_ids=documents, attention_mask=present, past_key_values=cache, use_cache=True, logits_to_keep=1)
    scores = scores.from_hidden(hidden[0]) if isinstance(scores, LayerScores) else scores
    indices, mask = select_topk(scores.detach().to(device).reshape(batch, n), lengths, ratio, kept_whole=whole)
    full = cache_bytes(cache)
    kept = DynamicCache(ddp_cache_data=[gather_kv(layer.keys, layer.values, indices) for layer in cache.layers])
    return Nuggets(kept, indices, mask, full)


@contextlib.contextmanager
def reading(model, adapters: NuggetAdapters | None):
    """The model as it reads nuggets: through the decoder adapter when ``adapters`` is given (the paper's
    method), else as the frozen model, even when a checkpoint's adapters are attached to it."""
    attached = NuggetAdapters.attached(model)
    if adapters is not None:
        adapters.use("decoder")
    with attached.disabled() if adapters is None and attached is not None else contextlib.nullcontext():
        yield


def after_nuggets(
    model, starts: list[int], tails: list[list[int]], soft_token: torch.Tensor | None, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a batch feeds after its nuggets: each row's tail (with ``soft_token`` [d] first, as in training:
    [nuggets; soft token; text]) embedded and left-padded, the mask of its real tokens, and their positions
    ``start, start + 1, ...`` (the nuggets keep their own).

    Returns (embeds [B, T, d], mask [B, T], positions [B, T])."""
    embed = model.get_input_embeddings()
    pieces = []
    for tail in tails:
        piece = embed(torch.tensor(tail, device=device, dtype=torch.long).reshape(-1))
        pieces.append(torch.cat([soft_token[None].to(piece.dtype), piece]) if soft_token is not None else piece)
    width = max(len(piece) for piece in pieces)
    embeds = torch.zeros(len(pieces), width, pieces[0].shape[-1], dtype=pieces[0].dtype, device=device)
    mask = torch.zeros(len(pieces), width, dtype=torch.long, device=device)
    positions = torch.zeros(len(pieces), width, dtype=torch.long, device=device)
    for i, (start, piece) in enumerate(zip(starts, pieces, strict=True)):
        embeds[i, width - len(piece) :] = piece
        mask[i, width - len(piece) :] = 1
        positions[i, width - len(piece) :] = torch.arange(start, start + len(piece), device=device)
    return embeds, mask, positions


def feed_after_nuggets(
    model, cache, tokens: torch.Tensor, start: int, soft_token: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits [1, t (+1), V] of ``tokens`` [1, t] fed after the cached nuggets of a ``start``-token document."""
    embeds, _, positions = after_nuggets(model, [start], [tokens[0].tolist()], soft_token, tokens.device)
    return model(inputs_embeds=embeds, past_key_values=cache, use_cache=True, position_ids=positions).logits


def stack_nuggets(model, rows: list, device) -> tuple[object, torch.Tensor]:
    """One cache for a batch: each row's nuggets (per layer keys and values [1, heads, k, dim], or None for a row
    without) left-padded with zeros to the longest, and the mask [B, k_max] of the real ones."""
    from transformers import DynamicCache

    kept = [0 if layers is None else layers[0][0].shape[2] for layers in rows]
    longest = max(kept)
    mask = torch.zeros(len(rows), longest, dtype=torch.long, device=device)
    for i, k in enumerate(kept):
        mask[i, longest - k :] = 1
    if longest == 0:
        return DynamicCache(config=model.config), mask
    template = next(layers for layers in rows if layers is not None)
    stacked = []
    for layer, (keys, values) in enumerate(template):
        shape = (len(rows), keys.shape[1], longest, keys.shape[3])
        batch_keys = torch.zeros(shape, dtype=keys.dtype, device=device)
        batch_values = torch.zeros((*shape[:3], values.shape[3]), dtype=values.dtype, device=device)
        for i, layers in enumerate(rows):
            if layers is not None:
                batch_keys[i, :, longest - kept[i] :] = layers[layer][0][0]
                batch_values[i, :, longest - kept[i] :] = layers[layer][1][0]
        stacked.append((batch_keys, batch_values))
    return DynamicCache(ddp_cache_data=stacked), mask


def nugget_attention_mask(
    nugget_scores: torch.Tensor, length: int, dtype=torch.float32, nugget_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Additive mask [B, 1, length, k + length] from each row's nugget scores [B, k]: every position sees the row's
    nuggets (``nugget_mask`` [B, k]: which of the k slots hold one; all by default), then the text causally. The
    nugget columns carry ``s - StopGrad(s)`` (eq. 18): zero in the forward pass, and in the backward pass each score
    receives the gradient of every attention logit that reaches its nugget, from every position, head and layer
    (eq. 17)."""
    batch, k = nugget_scores.shape
    causal = torch.full((length, length), float("-inf"), dtype=dtype, device=nugget_scores.device).triu(1)
    bias = straight_through_bias(nugget_scores.to(dtype))
    if nugget_mask is not None:
        bias = bias.masked_fill(~nugget_mask, float("-inf"))
    nuggets = bias[:, None, None, :].expand(batch, 1, length, k)
    return torch.cat([nuggets, causal.expand(batch, 1, length, length)], dim=-1)
