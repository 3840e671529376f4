"""What vLLM's V1 persistent batch does between steps, for tests of V1 logits processors: random sequences of
``BatchUpdate`` from vLLM's own ``BatchUpdateBuilder``."""

from __future__ import annotations

import random


class PersistentBatch:
    """What vLLM's input batch does between steps: finished requests leave, new ones take the
    lowest free rows, the last rows move down into the holes, and rows are sometimes swapped."""

    def __init__(self, rng: random.Random, new_request, vocab: int):
        from vllm.v1.sample.logits_processor.state import BatchUpdateBuilder

        self.rng, self.new_request, self.vocab = rng, new_request, vocab
        self.rows: list[dict | None] = []
        self.builder = BatchUpdateBuilder()
        self.serial = 0

    def step(self):
        from vllm.v1.sample.logits_processor.interface import MoveDirectionality

        rng = self.rng
        for index, request in enumerate(self.rows):
            if request is not None and rng.random() < 0.2:
                self.rows[index] = None
                self.builder.removed_append(index)
        for _ in range(rng.randint(0, 3)):
            index = self.builder.pop_removed()
            if index is None:
                index = len(self.rows)
                self.rows.append(None)
            params, config = self.new_request(rng)
            request = {
                "id": self.serial,
                "prompt": [rng.randrange(self.vocab) for _ in range(rng.randint(0, 8))],
                "output": [],
                "config": config,
            }
            self.serial += 1
            self.rows[index] = request
            self.builder.added.append((index, params, request["prompt"], request["output"]))
        while self.builder.has_removed():  # condense: the last occupied row fills the lowest hole
            hole = self.builder.peek_removed()
            last = max((i for i, r in enumerate(self.rows) if r is not None), default=-1)
            if hole >= last:  # only empty rows above: they stay in `removed`
                break
            self.builder.pop_removed()
            self.rows[hole], self.rows[last] = self.rows[last], None
            self.builder.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        while self.rows and self.rows[-1] is None:
            self.rows.pop()
        if len(self.rows) >= 2 and rng.random() < 0.3:
            a, b = rng.sample(range(len(self.rows)), 2)
            self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
            self.builder.moved.append((a, b, MoveDirectionality.SWAP))
        return self.builder.get_and_reset(len(self.rows))
