// Take or keep the service's leadership (leader election, service/live/leader.py). The holder
// of the current term renews it (its epoch unchanged); anyone takes it once its term has ended,
// with a new epoch: the fencing token that each later write checks (leader_term). Terms are
// measured on the server's clock, one clock for every contender.
// @param leadership: the leadership's name (one per database)
// @param holder: the contender's id (unique per process)
// @param epoch: the contender's current epoch (-1 when it does not lead)
// @param ttl_ms: the term in milliseconds of the server's clock
MERGE (l:Leader {name: $leadership})
ON CREATE SET l.epoch = 0, l.expires_at_ms = 0, l.holder = null
WITH l, timestamp() AS now
WITH l, now, (l.holder = $holder AND l.epoch = $epoch) AS renew, l.expires_at_ms < now AS ended
WITH l, now, renew, ended AND NOT renew AS take
SET l.epoch = CASE WHEN take THEN l.epoch + 1 ELSE l.epoch END,
    l.since_ms = CASE WHEN take THEN now ELSE l.since_ms END,
    l.holder = CASE WHEN take THEN $holder ELSE l.holder END,
    l.expires_at_ms = CASE WHEN renew OR take THEN now + $ttl_ms ELSE l.expires_at_ms END
RETURN l.holder AS holder, l.epoch AS epoch, l.expires_at_ms - now AS left_ms
