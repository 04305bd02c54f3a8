"""The process stack, the capacity probe, live runs, the demos and the testbench: what tests,
benchmarks and the demo run the system with."""
