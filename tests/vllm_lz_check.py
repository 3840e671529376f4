"""Runs in its own process (vLLM spawns workers): the LZ logits processor inside a real engine.

Prints one JSON line: outputs of plain requests alone and mixed with LZ requests, and the LZ
requests' outputs, so the test can check that the processor follows vLLM's batch changes.
"""

import json
import sys

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    from decodebench.models.lz import LZConfig
    from decodebench.models.lz.vllm_processor import LZPenaltyLogitsProcessor, lz_extra_args

    llm = LLM(
        model=sys.argv[1],
        gpu_memory_utilization=0.3,
        max_model_len=1024,
        enforce_eager=True,
        logits_processors=[LZPenaltyLogitsProcessor],
        seed=0,
    )
    prompts = [f"Count from {k} to {k + 30}, then count again:" for k in range(6)]
    # Different lengths make requests finish at different steps, so vLLM condenses and moves rows.
    plain = [SamplingParams(max_tokens=12 + 6 * k, temperature=0) for k in range(6)]
    lz = [
        SamplingParams(max_tokens=30 + 5 * k, temperature=0, extra_args=lz_extra_args(LZConfig(strength=100.0)))
        for k in range(6)
    ]
    alone = llm.generate(prompts, plain, use_tqdm=False)
    mixed = llm.generate(prompts + prompts, plain + lz, use_tqdm=False)
    print(
        "RESULT "
        + json.dumps(
            {
                "alone": [list(o.outputs[0].token_ids) for o in alone],
                "mixed_plain": [list(o.outputs[0].token_ids) for o in mixed[:6]],
                "mixed_lz": [list(o.outputs[0].token_ids) for o in mixed[6:]],
            }
        )
    )
