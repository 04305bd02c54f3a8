// Every device with its host and numbers.
MATCH (h:Host)-[:HAS_DEVICE]->(d:Device)
RETURN d.device_id AS device_id, h.host_id AS host_id, d.kind AS kind, d.cluster AS cluster,
       d.mem_bytes AS mem_bytes, d.peak_flops AS peak_flops, d.mem_bw_bytes_per_s AS mem_bw_bytes_per_s
ORDER BY device_id
