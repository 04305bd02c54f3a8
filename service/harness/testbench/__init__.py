"""The queue-policy testbench: every queue policy on the live executors with one seeded workload,
repeated, next to the simulator's prediction of the same runs (``slicesched testbench``)."""
