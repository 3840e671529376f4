"""What a decode step costs on the GPU, measured in one process on the embedded model (studies/gpu_bench.py's
``steps`` section): the regime a GPU is bought for (bf16 and fp32, batch 1 and a large batch), apart from lm_eval's
per-request loop.

- **Throughput and energy in steady state.** ``model.generate`` greedy on real prompts (cnndm_mini's chat prompts,
  each cut to its last ``prompt_tokens`` tokens so that every row does the same work), exactly ``new_tokens`` new
  tokens a row, the baseline against the LZ penalty's transformers processor (decodebench's own, the main job's
  settings). Each arm is warmed up once per configuration (discarded), then timed in rounds whose order rotates;
  a timed window repeats ``generate`` until it lasts ``min_window_s`` (NVML's energy counter updates every
  20-100 ms: a 2 s window spans 20 or more updates). Joules are the board's (NVML's total-energy counter) and, above
  the idle power measured in the same run with nothing running, the run's own; per output token and per total
  (prompt + output) token.
- **The LZ kernel's cost per step** in microseconds (``torch.utils.benchmark``, which synchronizes the device) at
  batch 1 and the large batch, and as arithmetic, its share of a 7B model's step at batch 1, whose lower bound is
  its bf16 weights (14 GB) read once at this device's measured copy bandwidth.
- **Where a step's time goes**: a torch profiler summary of one ``generate`` per arm and batch (the first dtype):
  the wall time, the device's busy time (its kernels' summed self time) and the host's, and the operators that take
  most of each.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial

from common import generate_exactly

LZ_ARGS = {"strength": 0.15, "window": 512, "buffer": 32, "codelength": "authors"}  # the main job's (registered)
SEVEN_B_BF16_BYTES = 7e9 * 2


@dataclass(frozen=True)
class StepSettings:
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    batches: tuple[int, ...] = (1, 64)
    rounds: int = 3
    new_tokens: int = 64
    prompt_tokens: int = 512
    min_window_s: float = 2.0
    idle_s: float = 5.0
    profile_tokens: int = 16


def arms() -> dict:
    """Each arm's logits processors for a batch whose prompts end at column ``width``."""
    from decodebench.models.lz.config import LZConfig
    from decodebench.models.lz.processors import LZPenaltyLogitsProcessor

    config = LZConfig.parse(LZ_ARGS)[0].validated()
    return {"baseline": lambda width: [], "lz": lambda width: [LZPenaltyLogitsProcessor(config, width)]}


def load_model(dtype: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.data.embedded import resolve_pretrained

    path, _ = resolve_pretrained("embedded")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    return model, AutoTokenizer.from_pretrained(path)


def real_prompts(tokenizer, rows: int, length: int, device: str):
    """``rows`` cnndm_mini chat prompts of at least ``length`` tokens, each cut to its last ``length`` (the chat
    template's generation prompt kept), as one batch without padding; documents repeat when there are too few."""
    import torch
    from common import task_docs

    task, docs = task_docs("cnndm_mini")
    prompts = []
    for doc in docs:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": task.doc_to_text(doc)}], add_generation_prompt=True, tokenize=True
        )
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        if len(ids) >= length:
            prompts.append(ids[-length:])
    if not prompts:
        raise SystemExit(f"no cnndm_mini prompt has {length} tokens: lower --prompt-tokens")
    batch = [prompts[i % len(prompts)] for i in range(rows)]
    return torch.tensor(batch, device=device), min(rows, len(prompts))


class Device:
    """The device's clock and energy: ``synchronize`` before reading a time; ``joules()`` from NVML's counter (None
    where there is none: the CPU dry run)."""

    def __init__(self, device: str):
        import torch

        from decodebench.measure.energy import open_meter

        self.name = device
        self.is_cuda = device == "cuda"
        self.meter = open_meter("cuda", [torch.cuda.current_device()]) if self.is_cuda else None
        self.energy_reason = None
        if self.meter is not None and not self.meter.available:
            self.energy_reason, self.meter = self.meter.reason, None
        elif not self.is_cuda:
            self.energy_reason = "no GPU: NVML's counter is a GPU's"

    def synchronize(self) -> None:
        import torch

        if self.is_cuda:
            torch.cuda.synchronize()

    def joules(self) -> float | None:
        return self.meter.read() if self.meter is not None else None

    def window(self, work, min_seconds: float) -> dict:
        """``work()`` repeated until the window lasts ``min_seconds``: its calls, seconds and joules."""
        self.synchronize()
        start_j, start = self.joules(), time.perf_counter()
        calls = 0
        while True:
            work()
            calls += 1
            self.synchronize()
            seconds = time.perf_counter() - start
            if seconds >= min_seconds:
                break
        end_j = self.joules()
        return {"calls": calls, "seconds": seconds, "joules": None if start_j is None else end_j - start_j}

    def idle_watts(self, seconds: float) -> dict:
        """The board's power with nothing running, over ``seconds``: the floor a run's own energy sits above."""
        if self.meter is None:
            return {"watts": None, "seconds": 0.0, "reason": self.energy_reason}
        self.synchronize()
        start_j, start = self.joules(), time.perf_counter()
        time.sleep(seconds)  # a measurement of idleness, not a wait for something to happen
        elapsed = time.perf_counter() - start
        return {"watts": (self.joules() - start_j) / elapsed, "seconds": elapsed, "reason": None}


def nvml_handle():
    """NVML's handle of this process's CUDA device (NVML counts devices its own way)."""
    import pynvml as nvml
    import torch

    from decodebench.measure.energy import visible_cuda_to_nvml

    nvml.nvmlInit()
    return nvml.nvmlDeviceGetHandleByIndex(visible_cuda_to_nvml([torch.cuda.current_device()])[0])


def gpu_facts() -> dict:
    """What the page says of the GPU: name, driver, CUDA driver, clocks (now and at most), power limit,
    persistence mode; from NVML. ``{}`` without one."""
    import pynvml as nvml

    try:
        handle = nvml_handle()
    except Exception:
        return {}

    def read(call, *args, scale=1.0):
        try:
            value = call(*args)
        except nvml.NVMLError as error:
            return f"unreadable ({error})"
        return value.decode() if isinstance(value, bytes) else value * scale if scale != 1.0 else value

    cuda_driver = read(nvml.nvmlSystemGetCudaDriverVersion)
    return {
        "name": read(nvml.nvmlDeviceGetName, handle),
        "driver": read(nvml.nvmlSystemGetDriverVersion),
        "cuda_driver": f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}" if isinstance(cuda_driver, int) else None,
        "sm_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": read(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
        "memory_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "memory_clock_max_mhz": read(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "power_limit_w": read(nvml.nvmlDeviceGetPowerManagementLimit, handle, scale=1e-3),
        "persistence_mode": read(nvml.nvmlDeviceGetPersistenceMode, handle),
    }


def sm_clock_mhz() -> int | None:
    """The SM clock now (read right after a timed window: the clock under load); None where NVML cannot say."""
    import pynvml as nvml

    try:
        return nvml.nvmlDeviceGetClockInfo(nvml_handle(), nvml.NVML_CLOCK_SM)
    except nvml.NVMLError:
        return None


def rotated(names: list[str], number: int) -> list[str]:
    """Round ``number``'s order (from 1): the arms rotated, so that each takes every position in turn."""
    shift = (number - 1) % len(names)
    return names[shift:] + names[:shift]


def throughput(settings: StepSettings, device: Device, on_config=lambda label: None) -> list[dict]:
    """For each dtype and batch: every arm warmed up once, then ``rounds`` timed windows each, the order rotating
    from round to round; each window's calls, seconds, joules and tokens."""
    import torch

    windows = []
    for dtype in settings.dtypes:
        model, tokenizer = load_model(dtype, device.name)
        for batch in settings.batches:
            input_ids, distinct = real_prompts(tokenizer, batch, settings.prompt_tokens, device.name)
            processors = {name: make(input_ids.shape[1]) for name, make in arms().items()}

            names = list(processors)
            on_config(f"{dtype}, batch {batch}")
            for name in names:  # the warm-up: discarded
                generate_exactly(model, tokenizer, input_ids, processors[name], settings.new_tokens)
            device.synchronize()
            for number in range(settings.rounds):
                for name in rotated(names, number + 1):
                    work = partial(generate_exactly, model, tokenizer, input_ids, processors[name], settings.new_tokens)
                    window = device.window(work, settings.min_window_s)
                    rows = window["calls"] * batch
                    windows.append(
                        {
                            "dtype": dtype,
                            "batch": batch,
                            "arm": name,
                            "round": number + 1,
                            "distinct_prompts": distinct,
                            "output_tokens": rows * settings.new_tokens,
                            "total_tokens": rows * (settings.new_tokens + settings.prompt_tokens),
                            "sm_clock_mhz": sm_clock_mhz() if device.is_cuda else None,
                            **window,
                        }
                    )
        del model
        if device.is_cuda:
            torch.cuda.empty_cache()
    return windows


def lz_step_microseconds(device: Device, batches: tuple[int, ...]) -> dict:
    """The LZ penalty's kernel on one step's logits (fp32, as ``generate`` hands them to processors; SmolLM2's
    vocabulary; a full window of 512 past tokens), the median of ``torch.utils.benchmark``'s autorange."""
    import torch
    from torch.utils.benchmark import Timer

    from decodebench.kernels.lz import apply_lz_penalty_

    vocab, history_len = 49152, LZ_ARGS["window"]
    generator = torch.Generator(device=device.name).manual_seed(0)
    out = {}
    for rows in batches:
        scores = torch.randn(rows, vocab, generator=generator, device=device.name)
        history = torch.randint(0, vocab, (rows, history_len), generator=generator, device=device.name)
        lengths = torch.full((rows,), history_len, device=device.name)
        timer = Timer(
            stmt="apply(scores, history, lengths, strength, window, buffer, codelength)",
            globals={
                "apply": apply_lz_penalty_,
                "scores": scores,
                "history": history,
                "lengths": lengths,
                **{key: LZ_ARGS[key] for key in ("strength", "window", "buffer", "codelength")},
            },
        )
        measured = timer.blocked_autorange(min_run_time=1.0)
        out[str(rows)] = {"median_us": measured.median * 1e6, "iqr_us": measured.iqr * 1e6, "runs": len(measured.times)}
    return out


def copy_bandwidth(device: Device, mib: int = 1024) -> float:
    """Bytes per second of a device-to-device copy (read + write), the median of 5 after one warm-up."""
    import torch

    source = torch.empty(mib * 2**20, dtype=torch.uint8, device=device.name)
    target = torch.empty_like(source)
    times = []
    for _ in range(6):
        device.synchronize()
        start = time.perf_counter()
        target.copy_(source)
        device.synchronize()
        times.append(time.perf_counter() - start)
    times = sorted(times[1:])
    return 2 * source.numel() / times[len(times) // 2]


def profile(settings: StepSettings, device: Device) -> list[dict]:
    """One ``generate`` of ``profile_tokens`` tokens per arm and batch (the first dtype) under torch's profiler:
    wall time, host and device busy time, and the top operators."""
    import torch
    from torch.profiler import ProfilerActivity

    dtype = settings.dtypes[0]
    model, tokenizer = load_model(dtype, device.name)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.is_cuda else [])
    out = []
    for batch in settings.batches:
        input_ids, _ = real_prompts(tokenizer, batch, settings.prompt_tokens, device.name)
        for name, make in arms().items():
            work = partial(
                generate_exactly, model, tokenizer, input_ids, make(input_ids.shape[1]), settings.profile_tokens
            )
            work()  # the warm-up, outside the profile
            device.synchronize()
            with torch.profiler.profile(activities=activities) as prof:
                start = time.perf_counter()
                work()
                device.synchronize()
                wall = time.perf_counter() - start
            events = prof.key_averages()
            host = sum(e.self_cpu_time_total for e in events) / 1e6
            busy = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
            top_host = sorted(events, key=lambda e: -e.self_cpu_time_total)[:5]
            top_device = sorted(events, key=lambda e: -getattr(e, "self_device_time_total", 0))[:5]
            out.append(
                {
                    "dtype": dtype,
                    "batch": batch,
                    "arm": name,
                    "new_tokens": settings.profile_tokens,
                    "wall_s": wall,
                    "host_self_s": host,
                    "device_busy_s": busy if device.is_cuda else None,
                    "top_host": [[e.key, e.self_cpu_time_total / 1e6] for e in top_host],
                    "top_device": [[e.key, e.self_device_time_total / 1e6] for e in top_device]
                    if device.is_cuda
                    else [],
                }
            )
    del model
    return out


def measure(settings: StepSettings, device_name: str, progress=print) -> dict:
    """The whole section: idle power before and after, throughput windows, the LZ kernel, the copy bandwidth,
    the profile."""
    import torch

    device = Device(device_name)
    progress("steps: idle power")
    idle_before = device.idle_watts(settings.idle_s)
    windows = throughput(settings, device, on_config=lambda label: progress(f"steps: {label}"))
    idle_after = device.idle_watts(settings.idle_s)
    progress("steps: the LZ kernel, the copy bandwidth, the profile")
    kernel = lz_step_microseconds(device, settings.batches)
    bandwidth = copy_bandwidth(device, 1024 if device.is_cuda else 64)
    profiled = profile(settings, device)
    return {
        "settings": asdict(settings),
        "device": device_name,
        "gpu": gpu_facts() if device.is_cuda else {},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "energy_unavailable": device.energy_reason,
        "idle": [idle_before, idle_after],
        "windows": windows,
        "lz_kernel": kernel,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "profile": profiled,
    }


# -- what the page shows of it ----------------------------------------------------------------------------------------
def idle_watts(steps: dict) -> float | None:
    """The mean of the idle power measured before and after the windows (None without a counter)."""
    values = [idle["watts"] for idle in steps["idle"] if idle["watts"] is not None]
    return sum(values) / len(values) if values else None


def over_rounds(ratios: list[float]) -> tuple[float, list[float] | None]:
    """A ratio measured in each of a few interleaved rounds: its geometric mean and the 95% interval over rounds
    (``decodebench.stats.round_ratio_interval``; None from one round)."""
    from decodebench.stats import round_ratio_interval

    interval = round_ratio_interval(ratios).as_list() if len(ratios) > 1 else None
    return statistics.geometric_mean(ratios), interval


def summary(steps: dict) -> list[dict]:
    """Per dtype, batch and arm: tokens/s per round; the arm's ratio over the baseline per round, their geometric
    mean and its interval over rounds; J per output and per total token, the board's and above idle, each the mean
    over rounds with its t interval."""
    from decodebench.stats import t_interval

    idle = idle_watts(steps)
    rows = []
    configs = sorted({(w["dtype"], w["batch"]) for w in steps["windows"]}, key=lambda c: (c[0] != "bfloat16", c))
    for dtype, batch in configs:
        mine = [w for w in steps["windows"] if (w["dtype"], w["batch"]) == (dtype, batch)]
        base = {w["round"]: w["output_tokens"] / w["seconds"] for w in mine if w["arm"] == "baseline"}
        for arm in dict.fromkeys(w["arm"] for w in mine):
            own = sorted((w for w in mine if w["arm"] == arm), key=lambda w: w["round"])
            speeds = [w["output_tokens"] / w["seconds"] for w in own]
            ratios = [speed / base[w["round"]] for speed, w in zip(speeds, own, strict=True)]
            ratio, interval = over_rounds(ratios)
            row = {
                "dtype": dtype,
                "batch": batch,
                "arm": arm,
                "rounds": len(own),
                "tokens_per_s": speeds,
                "ratios": ratios,
                "ratio": ratio,
                "ratio_interval": interval,
                "window_s": [w["seconds"] for w in own],
                "sm_clock_mhz": [w["sm_clock_mhz"] for w in own],
                "distinct_prompts": own[0]["distinct_prompts"],
            }
            if all(w["joules"] is not None for w in own):
                for per in ("output", "total"):
                    board = [w["joules"] / w[f"{per}_tokens"] for w in own]
                    row[f"j_per_{per}"] = [sum(board) / len(board), t_interval(board).as_list()]
                    if idle is not None:
                        above = [(w["joules"] - idle * w["seconds"]) / w[f"{per}_tokens"] for w in own]
                        row[f"j_per_{per}_above_idle"] = [sum(above) / len(above), t_interval(above).as_list()]
            rows.append(row)
    return rows
