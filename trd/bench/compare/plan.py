"""What a benchmark run measures, at two sizes: `full` (the report) and `smoke` (tests).

Every system runs the short workload at each N; the output-length sweep, the agent
workload (tiny pair) and the ablations run at the largest N only. The official-style
loop serves one request at a time whatever N is, so it runs at N=1, but on EVERY prompt
the other systems serve (each at the longest length it is served with): its outputs
are the reference every request is compared with, and its throughput is measured on
the same prompts as the runs it is compared to. Standard serving runs with its
servers' prefix cache (`std`) and stateless (`std_nocache`), on the short workload at
each N and at `std_length` output tokens at the largest N.

`cpu` is `full` cut to what the real pair allows on a small CPU host in under an hour:
one round (N requests at N), standard serving with its prefix cache only (std_nocache
re-prefills every context at every token: hours at 2048-token contexts), no ablation
daemons. The fixtures' `full` run has both.

`pair` is what the real pair allows on a 2-core host in about an hour: the short
workload (256 output tokens) at N = 1, 4, 16, one run each, standard serving with its
prefix cache, and no length sweep, forced-delay run or ablation daemons: the official
loop alone, one request at a time, would need about 80 minutes for 16 requests of 1024
tokens there.

`pair_long` is the output-length half that `pair` leaves out, cut to what the loop allows
there: at N=4, 256- and 1024-token outputs of the long workload for tokenrouterd,
1024 for standard serving, the short workload beside them (53 minutes on 2 cores, 20
of them the loop on 4 prompts of each workload).

`pair_long16` is the 1024-token half of that at N=16: tokenrouterd on 16 prompts of
1024 tokens (the short workload beside them), every output against the loop, which
took 85 minutes of the run's 109 on 2 cores for those 16 + 16 prompts; standard serving
is left out (about 40 minutes more; `pair_long` has it at 1024 tokens).

`smoke` runs every path at a tiny size; it leaves out the separate ablation daemons and
std_nocache (the same code as tokenrouterd and std with one setting changed, which the
engine's and the standard server's own tests cover). Its numbers mean nothing.
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
    agent_requests: int
    repeats: int  # runs of each short-workload daemon comparison at the largest N
    ablation_daemons: bool  # start the no_pending_kv / step_sync daemons
    std_systems: tuple[str, ...]  # standard serving: "std" (prefix cache), "std_nocache"
    scale: float = 1.0  # multiplies every corpus workload's prompt and output lengths
    forced_delay: bool = True  # the run with the large model's threshold forced to 4

    @property
    def long(self) -> int:
        """The longest output length of the long workload; 0: the plan has none."""
        return max((*self.lengths, self.std_length), default=0)

    def requests(self, n: int) -> int:
        return max(self.min_requests, self.rounds * n)

    def tokens(self, length: int) -> int:
        return max(2, round(self.scale * length))


PLANS = {
    "full": Plan(
        ns=(1, 4, 16), rounds=2, min_requests=4, lengths=(256, 512, 2048), std_length=512,
        agent_requests=16, repeats=2, ablation_daemons=True, std_systems=("std", "std_nocache"),
    ),
    "cpu": Plan(
        ns=(1, 4, 16), rounds=1, min_requests=2, lengths=(256, 512, 2048), std_length=512,
        agent_requests=16, repeats=2, ablation_daemons=False, std_systems=("std",),
    ),
    "pair": Plan(
        ns=(1, 4, 16), rounds=1, min_requests=2, lengths=(), std_length=0, agent_requests=0,
        repeats=1, ablation_daemons=False, std_systems=("std",), forced_delay=False,
    ),
    "pair_long": Plan(
        ns=(4,), rounds=1, min_requests=4, lengths=(256, 1024), std_length=1024,
        agent_requests=0, repeats=1, ablation_daemons=False, std_systems=("std",),
        forced_delay=False,
    ),
    "pair_long16": Plan(
        ns=(16,), rounds=1, min_requests=16, lengths=(1024,), std_length=0,
        agent_requests=0, repeats=1, ablation_daemons=False, std_systems=(), forced_delay=False,
    ),
    "smoke": Plan(
        ns=(1, 2), rounds=1, min_requests=2, lengths=(8, 16), std_length=8, agent_requests=2,
        repeats=2, ablation_daemons=False, std_systems=("std",), scale=1 / 32,
    ),
}  # fmt: skip
