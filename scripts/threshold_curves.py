"""Print the Markov model's throughput curves and thresholds for the R2R figures.

R2R (the paper's figures): the small model hands 35% of tokens to the large one,
which hands back after one token; every token is kept; steps take 6.0 ms (small)
and 27.9 ms (large) at any batch size; delta = 0.1 ms; the small model never
waits (B_small = 1).

    .venv/bin/python scripts/threshold_curves.py
"""

from __future__ import annotations

import numpy as np

from trd.batching import SystemSpec, recommend, to_table

MAX_N = 8


def main() -> None:
    spec = SystemSpec(
        p=np.array([[0.65, 0.35], [1.0, 0.0]]),
        c=np.ones((2, 2)),
        step_ms=np.array([[6.0] * MAX_N, [27.9] * MAX_N]),
        delta_ms=0.1,
    )
    results = recommend(spec, range(1, MAX_N + 1), fixed={0: 1})
    print("tokens/s by B_large (B_small = 1); * marks the best")
    print("  N  " + "".join(f"{b:>9}" for b in range(1, MAX_N + 1)))
    for n, result in results.items():
        cells = [f"{t:8.1f}" + ("*" if b == result.thresholds else " ") for b, t in result.curve]
        print(f"{n:3d}  " + "".join(cells))
    table = to_table(results, spec.m)
    print(f"thresholds table: small {table[0]}, large {table[1]}")


if __name__ == "__main__":
    main()
