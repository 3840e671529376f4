"""vLLM's engine on one GPU, from the slim bundle (studies/gpu_vllm_bundle.py): docs/benchmarks/gpu-vllm.md.

    PYTHONPATH=~/vllm-slim/site python3 studies/gpu_vllm.py --model ~/vllm-slim/model --out OUT
    python studies/gpu_vllm.py --from OUT            # here: the page from what came back

Each step runs in a process of its own under its own time limit (``STEPS``: 6 minutes in all) and writes its outcome
to ``OUT/<step>.json``, so that a step that fails, crashes or hangs leaves the others' outcomes and its own error:

1. ``facts``: the interpreter, torch, CUDA, Triton, the GPU and which vLLM and decodebench were imported;
2. ``extension``: vLLM's compiled core ops load on this torch (``vllm._C_stable_libtorch``, built for torch 2.13's
   stable ABI; the image has torch 2.11), and how many ops they register; where they do not, the engine steps run
   a labelled variant without them (``compiled_ops``: PyTorch-native custom ops, Triton attention);
3. ``v2-lz``: an engine on vLLM's V2 model runner (eager, dummy weights, Triton attention, bf16) serving requests
   with the LZ penalty off and on (decodebench's processor, from its entry point): the outputs must change; every
   call of the processor's step runs under ``torch.cuda.set_sync_debug_mode("warn")`` and must make no host
   synchronization (each one is named); tokens/s at batch 1 and 32, off against on, in alternating rounds;
4. ``v1-target`` and ``v1-ngram``: two engines on the V1 runner (fp32, where near-ties of dummy weights are rarest):
   target-only, and n-gram drafting (4 tokens) with vLLM's own rule, MTAD's (``mtad_tau``) and block verification
   (``block_verify``): greedy outputs must equal target-only's; each rule's acceptance counts from the engine's
   counters; tokens/s at batch 1 and 32.

``--dry-run`` runs the same on this machine's CPU with vLLM's CPU build (``tox -e vllm``: its V1 runner for every
step, fp32, small sizes), into ``--out``; tests/test_gpu_vllm.py runs it. It also records which distributions the
engine imported, which the bundle's test checks against the bundle and the image.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

DOC = "docs/benchmarks/gpu-vllm.md"
# step -> seconds it may take on the GPU (starting an engine included); 6 minutes in all
STEPS = {"facts": 30, "extension": 30, "v2-lz": 120, "v1-target": 80, "v1-ngram": 100}
PASSAGE = (
    "The river Alder rises in the hills north of the town, turns east past the old mill and the stone bridge, and "
    "reaches the sea after forty miles. The town council voted in March to repair the bridge before the winter."
)
STRONG_LZ = {"lz_penalty": 3.0, "lz_codelength": "propositions"}  # strong enough to change a dummy model's output
RULES = {"standard": {}, "mtad": {"mtad_tau": 0.1}, "block": {"block_verify": True}}
GPU = {"dtype": "bfloat16", "spec_dtype": "float32", "batches": (1, 32), "new_tokens": 128, "rounds": 3}
DRY = {"dtype": "float32", "spec_dtype": "float32", "batches": (1, 4), "new_tokens": 8, "rounds": 2}


def prompts(count: int) -> list[str]:
    return [f"Question {i + 1}: what does the council plan? {PASSAGE} Answer in one sentence." for i in range(count)]


def settings(dry_run: bool) -> dict:
    return DRY if dry_run else GPU


# -- the steps (each in its own process) -----------------------------------------------------------------------------
def facts(args) -> dict:
    import torch

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError as error:
        out["triton"] = f"not importable ({error})"
    import vllm

    import decodebench

    out.update(vllm=vllm.__version__, vllm_from=str(Path(vllm.__file__).parent), decodebench_from=decodebench.__file__)
    return out


def extension(args) -> dict:
    import importlib

    import torch

    module = "vllm._C" if args.dry_run else "vllm._C_stable_libtorch"  # the CPU build has its own
    try:
        importlib.import_module(module)
    except Exception as error:
        return {"module": module, "loaded": False, "error": f"{type(error).__name__}: {error}"}
    namespace = module.removeprefix("vllm.") + "::"  # the namespace its ops register under
    ops = [name for name in torch._C._dispatch_get_all_op_names() if name.startswith(namespace)]
    return {"module": module, "loaded": True, "namespace": namespace, "ops": len(ops)}


STAND_IN = (
    "without vLLM's compiled ops: the extension did not load (see its step), so an empty stand-in module lets "
    "vllm.platforms.cuda import and every custom op runs its PyTorch-native forward (custom_ops=none); attention, "
    "the KV cache writes and the rejection sampler are Triton kernels either way"
)


def compiled_ops(args) -> dict:
    """How the engine steps run vLLM's custom ops: compiled where the extension step loaded them, else (on a GPU) a
    labelled variant without them, so that one stay on a GPU machine also learns whether the engine runs on Python
    and Triton alone. Returns the engine's extra arguments and the label."""
    outcome = Path(args.out) / "extension.json"
    loaded = args.dry_run or (outcome.is_file() and json.loads(outcome.read_text()).get("loaded"))
    if loaded:
        return {"engine": {}, "label": "compiled", "stand_in": None}
    return {
        "engine": {"compilation_config": {"custom_ops": ["none"]}},
        "label": STAND_IN,
        "stand_in": "vllm._C_stable_libtorch",
    }


def engine(args, runner: str, dtype: str, **extra):
    """An in-process engine (its core in this process: the sync check wraps the processor here) on ``runner``."""
    ops = compiled_ops(args)
    if ops["stand_in"]:
        import types

        sys.modules[ops["stand_in"]] = types.ModuleType(ops["stand_in"])
    extra = {**ops["engine"], **extra}
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    runner = "v1" if args.dry_run else runner  # the V2 runner needs Triton, which vLLM's CPU build does not run
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    from vllm import LLM

    kwargs = {"attention_backend": "TRITON_ATTN"} if not args.dry_run else {}
    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        load_format="dummy",
        dtype=dtype,
        enforce_eager=True,
        max_model_len=1024,
        gpu_memory_utilization=0.3,
        seed=0,
        disable_log_stats=False,
        **kwargs,
        **extra,
    )
    from decodebench.models.model_runners import runner_of

    started_s = time.perf_counter() - started
    return llm, {"start_s": started_s, "runner": runner_of(llm.llm_engine.vllm_config), "custom_ops": ops["label"]}


def generate(llm, count: int, new_tokens: int, extra: dict, ignore_eos: bool = False) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=new_tokens, temperature=0.0, ignore_eos=ignore_eos, extra_args=dict(extra) or None
    )
    outputs = llm.generate(prompts(count), params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def speeds(llm, arms: dict[str, dict], setting: dict) -> list[dict]:
    """Each arm at each batch size: ``new_tokens`` a row (EOS ignored), one untimed warm-up each, then rounds whose
    order alternates; the wall time of each ``generate``."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    rows = []
    for batch in setting["batches"]:
        for extra in arms.values():
            generate(llm, batch, setting["new_tokens"], extra, ignore_eos=True)
        names = list(arms)
        for number in range(setting["rounds"]):
            for name in names if number % 2 == 0 else names[::-1]:
                sync()
                start = time.perf_counter()
                generate(llm, batch, setting["new_tokens"], arms[name], ignore_eos=True)
                sync()
                seconds = time.perf_counter() - start
                rows.append(
                    {
                        "batch": batch,
                        "arm": name,
                        "round": number + 1,
                        "seconds": seconds,
                        "tokens": batch * setting["new_tokens"],
                    }
                )
    return rows


def v2_lz(args) -> dict:
    import torch

    from decodebench.models.lz.vllm_processor import LZPenaltyLogitsProcessor

    setting = settings(args.dry_run)
    checked = {"calls": 0, "synchronizing": []}
    if torch.cuda.is_available():
        for method in ("apply", "apply_staged_writes"):
            original = getattr(LZPenaltyLogitsProcessor, method)

            def under_sync_debug(self, *call, original=original, method=method):
                # "warn" (not "error"): a synchronization is named without changing what the step does
                checked["calls"] += 1
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        return original(self, *call)
                    finally:
                        torch.cuda.set_sync_debug_mode(0)
                        found = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
                        checked["synchronizing"] += [f"{method}: {message}" for message in found]

            setattr(LZPenaltyLogitsProcessor, method, under_sync_debug)
    llm, out = engine(args, "v2", setting["dtype"])
    count = max(setting["batches"])
    off = generate(llm, count, 32, {})
    on = generate(llm, count, 32, STRONG_LZ)
    out.update(
        dtype=setting["dtype"],
        rows=count,
        changed_rows=sum(a != b for a, b in zip(off, on, strict=True)),
        sync_check=checked if torch.cuda.is_available() else {"not checked": "no CUDA device"},
        speeds=speeds(llm, {"lz off": {}, "lz on": {"lz_penalty": 0.15}}, setting),
    )
    return out


def v1_target(args) -> dict:
    setting = settings(args.dry_run)
    llm, out = engine(args, "v1", setting["spec_dtype"])
    out.update(
        dtype=setting["spec_dtype"],
        outputs=generate(llm, max(setting["batches"]), 32, {}),
        speeds=speeds(llm, {"target-only": {}}, setting),
    )
    return out


def v1_ngram(args) -> dict:
    from decodebench.measure.vllm_counters import ACCEPTED, DRAFT_TOKENS, DRAFTS, engine_counters
    from decodebench.models.mtad.vllm_engine import NGRAM

    setting = settings(args.dry_run)
    spec = {"method": "ngram", "num_speculative_tokens": 4, **NGRAM}
    llm, out = engine(args, "v1", setting["spec_dtype"], speculative_config=spec)
    outputs, counts = {}, {}
    for rule, extra in RULES.items():
        before = engine_counters(llm) or {}
        outputs[rule] = generate(llm, max(setting["batches"]), 32, extra)
        after = engine_counters(llm) or {}
        counts[rule] = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED)}
    out.update(
        dtype=setting["spec_dtype"],
        speculative_config=spec,
        outputs=outputs,
        counters=counts,
        speeds=speeds(llm, {"mtad": RULES["mtad"], "block": RULES["block"]}, setting),
    )
    return out


def imported_distributions() -> list[str]:
    """The distributions whose top-level modules this process imported (what the bundle must carry or the image
    have)."""
    import importlib.metadata

    owners = importlib.metadata.packages_distributions()
    return sorted({dist for name in list(sys.modules) for dist in owners.get(name.split(".")[0], [])})


STEP_FUNCTIONS = {"facts": facts, "extension": extension, "v2-lz": v2_lz, "v1-target": v1_target, "v1-ngram": v1_ngram}


def run_step(args) -> int:
    """One step in this process: its outcome, or its error and traceback, to OUT/<step>.json."""
    started = time.perf_counter()
    try:
        outcome = {"ok": True, **STEP_FUNCTIONS[args.step](args)}
    except BaseException as error:  # the outcome of the step is the error itself
        outcome = {
            "ok": False,
            "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc()[-4000:],
        }
    outcome["seconds"] = time.perf_counter() - started
    outcome["imported"] = imported_distributions()
    Path(args.out, f"{args.step}.json").write_text(json.dumps(outcome, indent=1, default=str))
    return 0 if outcome["ok"] else 1


def run_all(args) -> int:
    """Every step in a process of its own under its limit; a step that dies without writing its outcome gets one."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scale = 3 if args.dry_run else 1  # the CPU is slower to start an engine than a GPU
    failed = 0
    started = time.time()
    for step, limit in STEPS.items():
        command = [sys.executable, __file__, "--step", step, "--model", args.model, "--out", str(out)]
        command += ["--dry-run"] if args.dry_run else []
        print(f"[{step}] at most {limit * scale} s", flush=True)
        log = out / "log.txt"
        with log.open("a") as sink:
            sink.write(f"\n===== {step}\n")
            sink.flush()
            try:
                code = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, timeout=limit * scale).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        result = out / f"{step}.json"
        if not result.is_file():
            why = f"ran past its {limit * scale} s" if code == "timeout" else f"exited with {code} before writing"
            result.write_text(json.dumps({"ok": False, "error": why}))
        outcome = json.loads(result.read_text())
        failed += not outcome["ok"]
        print(f"[{step}] {'ok' if outcome['ok'] else 'FAILED: ' + outcome['error'][:300]}", flush=True)
    words = ["python3 studies/gpu_vllm.py", *(["--dry-run"] if args.dry_run else [])]
    run = {
        "command": " ".join(words),
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "seconds": round(time.time() - started),
        "dry_run": args.dry_run,
        "failed_steps": failed,
    }
    (out / "run.json").write_text(json.dumps(run, indent=1))
    return 1 if failed else 0


# -- the page --------------------------------------------------------------------------------------------------------
TITLE = "vLLM's engine on one GPU from a slim bundle: LZ on the V2 runner, MTAD and block verification on the V1 runner"
WAITING = [
    "**No GPU has run this yet.** What runs on a CPU is tested here (tests/test_gpu_vllm.py, in `tox -e vllm`): the "
    "bundle's parts travel beside the tree and unpack only when whole; it holds vLLM's stable-ABI core ops and not "
    "the kernel libraries it leaves out; every requirement of what it carries is carried, met by the image or left "
    "out on purpose; its compiled modules load on CPython 3.12; and this script's dry run on vLLM's CPU build passes "
    "every step and imports nothing that the bundle and the image lack. On a GPU machine without a network whose "
    "image has CPython 3.12 and torch (studies/gpu_image.txt), where each command takes at most 64 MiB with the "
    "tracked tree: build the bundle here, carry its parts one command at a time while the machine stays warm, run "
    "the script in the last one (at most 6 minutes), and render this page from what comes back:",
    "",
    "```",
    "tox -e gpu-vllm-bundle                                # here: .bundle/part-1..3, about 31 MiB each",
    "mkdir -p ~/b && cp -r .bundle/part-N ~/b/             # there, once per part (carry .bundle/part-N)",
    "python3 ~/b/part-1/unpack.py ~/b --extract ~/vllm-slim && "
    "PYTHONPATH=~/vllm-slim/site python3 studies/gpu_vllm.py --model ~/vllm-slim/model --out $OUT",
    "python studies/gpu_vllm.py --from docs/data/benchmarks/gpu-vllm   # here, with $OUT's files in that folder",
    "```",
]


def render(folder: Path) -> str:
    folder = Path(folder)
    lines = [f"# {TITLE}", ""]
    if not (folder / "run.json").is_file():
        return "\n".join([*lines, *WAITING, ""])
    run = json.loads((folder / "run.json").read_text())
    outcomes = {step: json.loads((folder / f"{step}.json").read_text()) for step in STEPS}
    known = outcomes["facts"] if outcomes["facts"]["ok"] else {}
    lines += [
        f"Written by `{run['command']}` on {run['date']} ({run['seconds']} s): {known.get('gpu') or 'no GPU'}, "
        f"Python {known.get('python', '?')}, torch {known.get('torch', '?')} (CUDA {known.get('cuda')}), Triton "
        f"{known.get('triton', '?')}, vLLM {known.get('vllm', '?')}. Its outcomes: `{folder}/`; `python "
        f"studies/gpu_vllm.py --from {folder}` renders this page again.",
        "",
    ]
    if run["dry_run"]:
        lines += [
            "**A dry run on a CPU** (vLLM's CPU build: the V1 runner for every step, fp32): it shows that the "
            "script works end to end; no figure here is a GPU's.",
            "",
        ]
    lines += ["| step | outcome | seconds |", "|---|---|---:|"]
    lines += [
        f"| {step} | {'ok' if o['ok'] else 'failed: ' + o['error'].splitlines()[0][:200]} | {o.get('seconds', 0):.0f} |"
        for step, o in outcomes.items()
    ]
    lines += ["", *extension_lines(outcomes["extension"]), *lz_lines(outcomes["v2-lz"])]
    lines += spec_lines(outcomes["v1-target"], outcomes["v1-ngram"])
    return "\n".join(lines).rstrip() + "\n"


def extension_lines(outcome: dict) -> list[str]:
    if not outcome["ok"] or not outcome.get("loaded"):
        return [f"The compiled ops did not load: {outcome.get('error', '?')}", ""]
    return [
        f"`{outcome['module']}` loaded on this torch and registered {outcome['ops']} ops under "
        f"`{outcome['namespace']}`.",
        "",
    ]


def speed_rows(rows: list[dict], reference: str) -> list[str]:
    """Per batch: each arm's tokens/s per round, and its ratio over ``reference`` in the same round."""
    from gpu_steps import over_rounds

    out = []
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        base = {r["round"]: r["tokens"] / r["seconds"] for r in mine if r["arm"] == reference}
        for arm in dict.fromkeys(r["arm"] for r in mine):
            own = sorted((r for r in mine if r["arm"] == arm), key=lambda r: r["round"])
            speeds = [r["tokens"] / r["seconds"] for r in own]
            ratio = "-"
            if arm != reference and base:
                ratios = [speed / base[r["round"]] for speed, r in zip(speeds, own, strict=True)]
                geo, interval = over_rounds(ratios)
                low, high = interval or (geo, geo)
                ratio = f"{' / '.join(f'{r:.3f}' for r in ratios)}; {geo:.3f}x [{low:.3f}, {high:.3f}]"
            out.append(f"| {batch} | {arm} | {' / '.join(f'{s:.0f}' for s in speeds)} | {ratio} |")
    return out


def lz_lines(outcome: dict) -> list[str]:
    if not outcome["ok"]:
        return ["LZ on the V2 runner: not run (the step failed; its error is in the table and its log).", ""]
    check = outcome["sync_check"]
    if "not checked" in check:
        sync = f"host synchronizations in the processor's step: not checked ({check['not checked']})"
    else:
        found = check["synchronizing"]
        sync = (
            f"{len(found)} of {check['calls']} calls of the processor's step synchronized with the host "
            f"({'; '.join(sorted(set(found)))})"
            if found
            else f"none of {check['calls']} calls of the processor's step synchronized with the host "
            '(`torch.cuda.set_sync_debug_mode("warn")` around each)'
        )
    return [
        f"## LZ on the {outcome['runner'].upper()} runner",
        "",
        *ops_note(outcome),
        f"Engine started in {outcome['start_s']:.0f} s ({outcome['dtype']}, eager, dummy weights). LZ on "
        f"({STRONG_LZ}) changed {outcome['changed_rows']} of {outcome['rows']} greedy outputs of 32 tokens; {sync}.",
        "",
        "Tokens/s (EOS ignored), LZ at the main job's strength (0.15) against off, rounds alternating on one engine:",
        "",
        "| batch | arm | tokens/s each round | vs lz off each round; geometric mean [95% CI over rounds] |",
        "|---:|---|---|---|",
        *speed_rows(outcome["speeds"], "lz off"),
        "",
    ]


def ops_note(outcome: dict) -> list[str]:
    """A variant said first: the engine ran without vLLM's compiled ops."""
    return (
        [f"**A variant: this engine ran {outcome['custom_ops']}.**", ""] if outcome["custom_ops"] != "compiled" else []
    )


def spec_lines(target: dict, ngram: dict) -> list[str]:
    from decodebench.measure.vllm_counters import ACCEPTED, DRAFT_TOKENS, DRAFTS

    if not (target["ok"] and ngram["ok"]):
        return ["MTAD and block verification: not compared (a step failed; its error is in the table).", ""]
    reference = target["outputs"]
    lines = [
        f"## MTAD and block verification on the {ngram['runner'].upper()} runner",
        "",
        *ops_note(ngram),
        f"Engines started in {target['start_s']:.0f} s (target-only) and {ngram['start_s']:.0f} s (n-gram drafts: "
        f"{ngram['speculative_config']}), {ngram['dtype']}, eager, dummy weights. Greedy, 32 tokens:",
        "",
        "| rule | outputs equal to target-only's | drafts | draft tokens | accepted | tokens a step |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for rule, outputs in ngram["outputs"].items():
        equal = sum(a == b for a, b in zip(outputs, reference, strict=True))
        counts = ngram["counters"][rule]
        per_step = f"{1 + counts[ACCEPTED] / counts[DRAFTS]:.2f}" if counts[DRAFTS] else "-"
        lines.append(
            f"| {rule} | {equal} of {len(reference)} | {counts[DRAFTS]:.0f} | {counts[DRAFT_TOKENS]:.0f} | "
            f"{counts[ACCEPTED]:.0f} | {per_step} |"
        )
    return [
        *lines,
        "",
        "Tokens/s (EOS ignored). MTAD and block verification alternate on one engine; target-only ran on its own "
        "engine before them (not interleaved with them: read the two engines' figures side by side, not as a "
        "measured ratio):",
        "",
        "| batch | arm | tokens/s each round | vs the first arm each round; geometric mean [95% CI over rounds] |",
        "|---:|---|---|---|",
        *speed_rows(target["speeds"], "target-only"),
        *speed_rows(ngram["speeds"], "mtad"),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--model", help="the folder with the embedded model's config and tokenizer (the bundle's)")
    parser.add_argument("--out", help="where each step's outcome goes")
    parser.add_argument("--dry-run", action="store_true", help="on this machine's CPU with vLLM's CPU build")
    parser.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)
    parser.add_argument("--from", dest="from_data", help="render the page from these outcomes, running nothing")
    parser.add_argument("--doc", default=DOC, help=f"the page to write with --from (default {DOC})")
    args = parser.parse_args(argv)
    if args.from_data:
        from common import write_doc

        return write_doc(args.doc, render(Path(args.from_data)))
    if not args.model or not args.out:
        parser.error("--model and --out are needed to run the steps")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (the bundle's model folder holds one)")
    return run_step(args) if args.step else run_all(args)


if __name__ == "__main__":
    raise SystemExit(main())
