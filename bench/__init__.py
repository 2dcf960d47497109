"""rsd's benchmarks: programs, not tests. Run each from the repository root as
``python -m bench.NAME`` (codec, claims, tasks, renewals, durability, torn_tail, hostile)."""
