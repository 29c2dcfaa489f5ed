"""icesink benchmarks: `python -m bench --size small|medium|large` (see docs/performance.md)."""
