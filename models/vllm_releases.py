"""The vLLM releases decodebench's vLLM plugins were validated against, and the signatures of the vLLM internals they
wrap or replace, so that a vLLM that changed one is refused by name instead of run wrong.

decodebench reaches into vLLM where it has no plugin point: MTAD's and block verification's rules wrap the V1
runner's ``rejection_sample`` and its draft sampling (models/mtad/vllm_v1_rules.py), the admission check wraps the
frontend's validator (models/mtad/vllm_plugin.py), and the CPU build's fix replaces three of the sampler's kernels
(models/backends/vllm_cpu_fix.py). Each was read and tested against the releases in ``VALIDATED_SERIES``; a release
outside them, or one whose wrapped function no longer has a signature validated here, runs none of them (requests
that ask for MTAD or block verification are then refused, naming why). LZ's processors use vLLM's public
logits-processor interfaces only and load on any release whose loaders accept them.

How each series was validated: 0.32 on vLLM's CPU build (``vllm-cpu`` 0.32.0: its own rejection-sampler and
logits-processor tests, decodebench's engines) and on CUDA; 0.33 with 0.33.0's Python files from its source
distribution over the 0.32.0 CPU build's compiled parts (no CPU build of 0.33 exists yet): its own rejection-sampler
and logits-processor tests with decodebench's plugins loaded, and decodebench's MTAD and block rules at the unit
level (tests/vllm_suite.py runs them; tests/test_vllm_upstream.py checks what they gave).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass

# release series (major.minor) decodebench's vLLM plugins were validated against; pyproject's `vllm` extra says the same
VALIDATED_SERIES = ("0.32", "0.33")


@dataclass(frozen=True)
class Internal:
    """A vLLM function decodebench wraps or replaces, and every signature of it validated (``parameters``' text)."""

    module: str
    name: str  # "function" or "Class.method"
    signatures: tuple[str, ...]

    def resolve(self):
        owner = importlib.import_module(self.module)
        for part in self.name.split("."):
            owner = getattr(owner, part)
        return owner

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


REJECTION_SAMPLE_032 = (
    "(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, "
    "bonus_token_ids, sampling_metadata, synthetic_mode=False, synthetic_conditional_rates=None, use_fp64_gumbel=False"
)
# what the verification rules wrap (MTAD, block verification: V1 runner)
VERIFICATION_INTERNALS = (
    Internal(
        "vllm.v1.sample.rejection_sampler",
        "rejection_sample",
        (
            REJECTION_SAMPLE_032 + ")",
            # 0.33: three trailing arguments with defaults for its lossy FLy rule, which the wrapper passes through
            REJECTION_SAMPLE_032 + ", fly_window_size=None, fly_entropy_threshold=None, fly_entropy_top_k=3)",
        ),
    ),
    Internal(
        "vllm.v1.spec_decode.llm_base_proposer",
        "compute_probs_and_sample_next_token",
        ("(logits, sampling_metadata, use_fp64_gumbel=False)",),
    ),
    Internal(
        "vllm.v1.worker.gpu_model_runner",
        "build_logitsprocs",
        ("(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=())",),
    ),
    Internal("vllm.v1.engine.input_processor", "InputProcessor._build_logits_processors_params_validator", ("(self)",)),
    # called, not wrapped: the draft's warping passes (logits, k, p); 0.33 added a trailing argument with a default
    Internal(
        "vllm.v1.sample.ops.topk_topp_sampler",
        "apply_top_k_top_p",
        ("(logits, k, p)", "(logits, k, p, has_topp_only_rows=True)"),
    ),
)
# what the CPU build's fix replaces (the sampler calls them by these names with these arguments)
CPU_FIX_INTERNALS = (
    Internal(
        "vllm.v1.sample.rejection_sampler",
        "expand_batch_to_tokens",
        ("(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0)",),
    ),
    Internal(
        "vllm.v1.sample.rejection_sampler",
        "_rejection_greedy_sample",
        (
            "(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy, "
            "max_spec_len, uniform_probs, synthetic_conditional_rates)",
        ),
    ),
    Internal(
        "vllm.v1.sample.rejection_sampler",
        "_rejection_random_sample",
        (
            "(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids, "
            "recovered_token_ids, uniform_probs, is_greedy, max_spec_len, synthetic_conditional_rates)",
        ),
    ),
)


def signature_text(function) -> str:
    """A function's parameters as names and defaults (annotations left out: they are strings or types depending on
    the module's ``from __future__`` imports, and change nothing a caller passes)."""
    parts = []
    for parameter in inspect.signature(function).parameters.values():
        star = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        default = "" if parameter.default is parameter.empty else f"={parameter.default!r}"
        parts.append(f"{star}{parameter.name}{default}")
    return f"({', '.join(parts)})"


def changed_internals(internals: tuple[Internal, ...]) -> list[str]:
    """What of ``internals`` this vLLM no longer has as validated: each named, with what it is now."""
    changed = []
    for internal in internals:
        try:
            found = signature_text(internal.resolve())
        except (ImportError, AttributeError) as exc:
            changed.append(f"{internal} is gone ({exc})")
            continue
        except (TypeError, ValueError):  # not a function one can read a signature of
            changed.append(f"{internal} is no longer a function")
            continue
        if found not in internal.signatures:
            changed.append(f"{internal}{found} (validated: {' or '.join(internal.signatures)})")
    return changed


def installed_vllm() -> str:
    import vllm

    return vllm.__version__


def series(version: str) -> str:
    """``0.33.0+cpu`` -> ``0.33``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def release_refusal(internals: tuple[Internal, ...], what: str, version: str | None = None) -> str | None:
    """Why ``what`` cannot run on this vLLM (a release outside the validated series, or a changed internal), or None."""
    version = version or installed_vllm()
    validated = ", ".join(f"{s}.x" for s in VALIDATED_SERIES)
    if series(version) not in VALIDATED_SERIES:
        return f"{what} were validated against vLLM {validated} and this is vLLM {version}"
    if changed := changed_internals(internals):
        return f"{what} wrap vLLM internals that vLLM {version} changed: {'; '.join(changed)}"
    return None


@functools.cache
def verification_refusal() -> str | None:
    """Why this vLLM cannot run decodebench's verification rules (MTAD, block), or None (checked once a process)."""
    refusal = release_refusal(VERIFICATION_INTERNALS, "decodebench's verification rules (MTAD, block)")
    if refusal is None:
        return None
    return f"{refusal}: requests that ask for them are refused (install vllm>=0.32,<0.34, or a decodebench made for it)"
