"""The pure discrete-event simulator: ``engine`` (event loop), ``iteration`` (analytic
iteration cost, memoised), ``cluster`` (replicas, batching, memory, links, placed slices),
``report`` (observer and outputs), ``sla`` (SLA classes), ``whatif`` (fork-and-predict) and
``analytic`` (a roofline-like cost model for tests and benchmarks)."""
