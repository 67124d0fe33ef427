"""Building blocks of `scripts/bench.py`: workloads, the load client, the systems under test."""
