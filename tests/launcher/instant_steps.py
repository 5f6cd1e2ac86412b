"""A scheduler and a step timer for tests of the load simulation's way in (schedsim._FrontEnd):
steps so short that each first token leaves at its request's hand-over, and limits no request
of those tests reaches, so what a test measures is the front end alone."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.planner.schedsim import SchedulerLimits, StepBatch

LIM = SchedulerLimits(max_num_batched_tokens=65536, max_num_seqs=256, kv_blocks=10_000)
STEP_S = 1e-7  # steps this short leave each first token at its request's hand-over


@dataclass(frozen=True)
class Instant:
    def step_s(self, batch: StepBatch) -> float:
        return STEP_S
