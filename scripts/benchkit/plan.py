"""What a benchmark run measures, at two sizes: `full` (the report) and `smoke` (tests).

Sizes are chosen so `full` runs in well under 20 minutes on a 2-core CPU host: every
system runs the short workload at each N; the output-length sweep, the agent workload
and the ablations run at the largest N only; the research-code loop runs a few
requests, since it serves one request at a time whatever N is. Standard serving runs
twice, with its servers' prefix cache (`std`) and stateless (`std_nocache`), on the
short workload at each N and at `std_length` output tokens at the largest N.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Plan:
    ns: tuple[int, ...]  # closed-loop concurrency levels
    rounds: int  # requests per run = rounds x N (at least `min_requests`)
    min_requests: int
    lengths: tuple[int, ...]  # max output lengths swept at the largest N
    std_length: int  # output length of the standard-serving comparison at the largest N
    official_requests: int
    agent_requests: int
    repeats: int  # runs of each short-workload comparison at the largest N; the best counts
    scale: float = 1.0  # multiplies every workload's prompt and output lengths

    def requests(self, n: int) -> int:
        return max(self.min_requests, self.rounds * n)

    def tokens(self, length: int) -> int:
        return max(2, round(self.scale * length))


PLANS = {
    "full": Plan(
        ns=(1, 4, 16), rounds=2, min_requests=4, lengths=(256, 512, 1024, 2048),
        std_length=512, official_requests=4, agent_requests=16, repeats=2,
    ),
    "smoke": Plan(
        ns=(1, 2), rounds=1, min_requests=2, lengths=(8, 16), std_length=8,
        official_requests=2, agent_requests=2, repeats=1, scale=1 / 32,
    ),
}  # fmt: skip
