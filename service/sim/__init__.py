"""The pure discrete-event simulator: ``engine`` (event loop), ``iteration`` (analytic
iteration cost, memoised), ``cluster`` (the facade: construct, submit, run, report),
``replica`` (continuous batching and KV admission), ``routing`` (which replica's queue a request
waits in), ``resource`` (device timelines and FIFO links), ``state`` (all mutable state, and how a
fork copies it), ``config`` (simulator limits), ``report`` (observer and outputs), ``sla`` (SLA
classes), ``whatif`` (fork-and-predict), ``view`` (the scheduler's ClusterView over a simulated
cluster) and ``analytic`` (a roofline-like cost model for tests and benchmarks)."""
