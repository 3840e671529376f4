"""How much faster a train-nugget step is with its windows stepped together (``--micro-batch``) than one at a time;
prints, it writes no page.

    python studies/nugget_batch_bench.py                       # the CPU here, 8 windows a step
    python studies/nugget_batch_bench.py --device cuda --windows 32 --micro-batch 8,32
    python studies/nugget_batch_bench.py --windows 2 --rounds 3 --bfloat16   # bfloat16 autocast against float32

One step of ``train-nugget --recipe authors`` (its windows: one document each, BOS first; its LoRA targets, dropout
and scorer features) on the embedded model: every round draws ``--windows`` windows from the default corpus (Debian's
dictionaries), then times the gradients of their mean loss (``training.backward_step``, what ``train`` runs before the
optimizer's update) once one window at a time and once per micro-batch size, the order rotating from round to round,
in the precision train-nugget picks for the device (``training.mixed_precision``: bfloat16 autocast where the device
has bfloat16, else float32); ``--bfloat16`` adds one window at a time under bfloat16 autocast whatever the device has.
Printed per setting: seconds a window (mean over rounds), and the speed-up over one at a time (the ratio of the round's
times, geometric mean over rounds with its 95% interval, ``decodebench.stats.round_ratio_interval``) and the largest
difference in the step's loss from one at a time (rounding only: the same windows, the adapters' dropout off so that
every setting computes the same function).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the order rotating (default 4)")
    parser.add_argument("--windows", type=int, default=8, help="windows a step (default 8; the authors' 32)")
    parser.add_argument("--micro-batch", default="4,8", help="sizes compared with 1, separated by commas (default 4,8)")
    parser.add_argument("--ratio", type=float, default=5.0, help="compression ratio (default 5)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: as train-nugget)")
    parser.add_argument(
        "--bfloat16", action="store_true", help="also one window at a time under bfloat16 autocast, whatever the device"
    )
    args = parser.parse_args(argv)
    try:
        sizes = [1, *sorted({int(size) for size in args.micro_batch.split(",")} - {1})]
    except ValueError:
        parser.error(f"--micro-batch: integers separated by commas, got {args.micro_batch!r}")
    if args.rounds < 2 or args.windows < 1 or min(sizes) < 1 or len(sizes) < 2:
        parser.error("--rounds must be at least 2 (an interval over rounds), --windows and each size at least 1")

    import torch
    from tqdm import tqdm

    from decodebench.data.embedded import ensure_embedded_model
    from decodebench.models.nugget.training import (
        backward_step,
        mixed_precision,
        read_documents,
        split_corpus,
        trainable_parts,
        training_device,
        training_windows,
    )
    from decodebench.models.nugget.training_settings import AUTHORS_RECIPE, TrainingSettings
    from decodebench.stats import round_ratio_interval

    settings = TrainingSettings(**AUTHORS_RECIPE, ratio=args.ratio)
    device = training_device(args.device)
    torch.manual_seed(settings.seed)
    tokenizer, model, scorer, adapters = trainable_parts(str(ensure_embedded_model()), settings, device)
    trained = [*scorer.parameters(), adapters.soft_token]
    for adapter in ("encoder", "decoder"):
        trained += adapters.parameters(adapter)
    training_docs, _, _ = split_corpus(read_documents(None)[0])
    windows = training_windows(tokenizer, training_docs, settings)
    rng = random.Random(settings.seed)

    # each setting: (windows a pass, bfloat16 autocast or None for the device's choice)
    settings_timed = [(size, None) for size in sizes] + ([(1, True)] if args.bfloat16 else [])
    names = {
        setting: f"micro-batch {setting[0]:>2}" + (", bfloat16 autocast" if setting[1] else "")
        for setting in settings_timed
    }

    def timed_step(step_windows, setting) -> tuple[float, float]:
        for parameter in trained:
            parameter.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        loss = backward_step(model, scorer, adapters, step_windows, settings.ratio, *setting)  # .item() waits for it
        return time.perf_counter() - started, loss

    backward_step(model, scorer, adapters, [windows.sample(rng)], settings.ratio, 1)  # warm-up, not timed
    seconds = {setting: [] for setting in settings_timed}
    losses = {setting: [] for setting in settings_timed}
    for number in tqdm(range(args.rounds), desc="rounds"):
        step_windows = [windows.sample(rng) for _ in range(args.windows)]
        shift = number % len(settings_timed)
        for setting in settings_timed[shift:] + settings_timed[:shift]:
            took, loss = timed_step(step_windows, setting)
            seconds[setting].append(took)
            losses[setting].append(loss)
    tokens = sum(len(w.compressed) + len(w.target) for w in step_windows)
    precision = "bfloat16 autocast" if mixed_precision(device) else "float32"
    print(
        f"{device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, torch "
        f"{torch.get_num_threads()} threads, {precision} by default), {args.rounds} rounds of {args.windows} windows "
        f"(the last round's: {tokens / args.windows:.0f} tokens a window), ratio {args.ratio:g}"
    )
    one = settings_timed[0]
    for setting in settings_timed:
        line = f"{names[setting]}: {statistics.mean(seconds[setting]) / args.windows:.3f} s a window"
        if setting != one:
            ratios = [first / this for first, this in zip(seconds[one], seconds[setting], strict=True)]
            interval = round_ratio_interval(ratios)
            difference = max(abs(a - b) for a, b in zip(losses[one], losses[setting], strict=True))
            line += (
                f", {statistics.geometric_mean(ratios):.2f}x [{interval.low:.2f}, {interval.high:.2f}] one at a "
                f"time's speed (95% over rounds, n = {args.rounds}); loss differs by at most {difference:.2e}"
            )
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
