"""measure/: what a run measures (memory, NVML, timing, bandwidth, the fingerprint) and the formulas rows share (metrics.py)."""
