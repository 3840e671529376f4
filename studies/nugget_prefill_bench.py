"""What the answer-span scorer (``--model nugget``'s default selector) adds to a row's prefill, with its scores read
from the encoding pass (as it runs) against a pass of their own (as before 2026-11-29); prints, it writes no page.

    python studies/nugget_prefill_bench.py                      # the first 40 squad_mini questions, ratio 10
    python studies/nugget_prefill_bench.py --limit 100 --ratio 5 --device cuda

For each squad_mini question (its prompt as lm_eval sends it with ``--apply_chat_template``), three ways to prefill the
opening and the document, the order rotating from question to question, on the embedded model:

- ``plain``: the frozen model over the same tokens, its cache kept whole (no compression: the reference);
- ``own pass``: the scorer's layers run over the document first (``layer_hidden_states``), then the encoding pass;
- ``shared``: one pass, the scorer reading its layer's states as the pass computes them (``LayerScores``).

Printed: seconds a question for each (mean), and each compressed way's time over plain's and ``own pass`` over
``shared``, paired per question (geometric mean with its 95% interval, ``decodebench.stats.round_ratio_interval``
over questions); and on how many questions the two compressed ways keep the same tokens (all of them, unless the
shared pass read other states).
"""

from __future__ import annotations

import argparse
import statistics
import time

import common

SIDES = ("plain", "own pass", "shared")


def prompt_tokens(lm, task, doc: dict) -> tuple[str, list[int], int, int]:
    """A document's prompt as lm_eval sends it (``--apply_chat_template``) to ``--model nugget`` (``lm``): its text,
    its tokens, where the document ends (``n``) and the opening kept whole (``wrapper=kept``, the default)."""
    prompt = lm.apply_chat_template([{"role": "user", "content": task.doc_to_text(doc)}])
    ids = lm.tok_batch_encode([prompt])[0][0].tolist()
    n = lm.method.split_point(lm, ids)
    return prompt, ids, n, lm.method.opening_length(lm, ids, n)


def prefill(lm, side: str, document, opening: int, tail: list[int], ratio: float):
    """One prefill of ``document`` [1, n] by ``lm`` (``--model nugget``, answer-span scorer): ``plain``, the frozen
    model with its cache whole (nothing compressed); ``shared``, as the default runs, the scorer reading the encoding
    pass's states as it computes them, then the kept positions; ``own pass``, the scorer's layers run first. Returns
    the kept indices (None for plain)."""
    from decodebench.models.nugget.compressor import LayerScores, encode_nuggets

    if side == "plain":
        lm.model(input_ids=document, use_cache=True, logits_to_keep=1)
        return None
    selector = lm.method.selector
    scores = selector.scores(lm, document, tail) if side == "own pass" else selector.encoding_scores(lm, document, tail)
    assert isinstance(scores, LayerScores) == (side == "shared")
    return encode_nuggets(lm.model, document, scores, ratio, encoder=False, kept_whole=opening).indices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--limit", type=int, default=40, help="squad_mini questions (default 40)")
    parser.add_argument("--ratio", type=float, default=10.0, help="compression ratio (default 10)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    args = parser.parse_args(argv)
    if args.limit < 2:
        parser.error("--limit must be at least 2 (an interval over questions)")

    import torch
    from lm_eval.api.registry import get_model
    from nugget_kept import TASK, split_question
    from tqdm import tqdm

    from decodebench.stats import round_ratio_interval

    task, docs = common.task_docs(TASK, args.limit)
    lm = get_model("nugget").create_from_arg_string(
        f"pretrained=embedded,selector=answer-spans,ratio={args.ratio:g},device={args.device}"
    )
    device = lm.device

    def synchronized():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    seconds = {side: [] for side in SIDES}
    same = 0
    with torch.inference_mode():
        ids, n, opening, _ = split_question(lm, task, docs[0], 0)
        prefill(lm, "shared", torch.tensor([ids[:n]], device=device), opening, ids[n:], args.ratio)  # warm-up
        for number, doc in enumerate(tqdm(docs, desc="questions")):
            ids, n, opening, _ = split_question(lm, task, doc, number)
            document = torch.tensor([ids[:n]], device=device)
            shift = number % len(SIDES)
            kept = {}
            for side in SIDES[shift:] + SIDES[:shift]:
                started = synchronized()
                kept[side] = prefill(lm, side, document, opening, ids[n:], args.ratio)
                seconds[side].append(synchronized() - started)
            same += torch.equal(kept["own pass"], kept["shared"])

    name = f"CPU, torch {torch.get_num_threads()} threads"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    print(f"{device} ({name}), {len(docs)} squad_mini questions, ratio {args.ratio:g}, the order rotating per question")
    for side in SIDES:
        print(f"{side}: {statistics.mean(seconds[side]):.3f} s a question (mean)")
    for slow, fast in (("own pass", "plain"), ("shared", "plain"), ("own pass", "shared")):
        ratios = [a / b for a, b in zip(seconds[slow], seconds[fast], strict=True)]
        interval = round_ratio_interval(ratios)
        print(
            f"{slow} / {fast}: {statistics.geometric_mean(ratios):.2f}x [{interval.low:.2f}, {interval.high:.2f}] "
            f"(95%, paired per question, n = {len(ratios)})"
        )
    print(f"the same tokens kept by own pass and shared: {same} of {len(docs)} questions")
    return 0 if same == len(docs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
