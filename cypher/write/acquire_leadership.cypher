// Take or keep the service's leadership (leader election, service/live/leader.py). The holder
// of the current term renews it (its epoch unchanged), even after the term ended if nobody took
// it; another contender takes it with a new epoch (the fencing token that each later write
// checks, leader_term) only once the term has stood ended for a grace: the first ask that finds
// it ended marks when (ended_seen_ms), an ask at least $grace_ms later takes it. Why the grace:
// after a Neo4j outage longer than a term every term has ended, and without it whichever
// contender reached the server first won, often the standby, which then recovered the whole
// state on a cold server while the deposed leader, warm, stopped (found in the chaos run). A
// released term (expires_at_ms 0) is taken at once. Terms are measured on the server's clock,
// one clock for every contender. An outage is told apart from a dead leader by when the ended
// term was first seen: a standby that could ask sees a dead leader's term ended within an ask of
// its end; one first seen ended more than a term after its end means nobody reached the server
// (a Neo4j restart), and then the grace is longer by $outage_grace_ms, because the leader's first
// ask on a cold, restarted server can take seconds (found in the chaos-slice run: 6.6 s, while the
// standby's two asks 1.5 s apart went through).
// The clock is read after the node's write lock is held (the SET of asks takes it) and from the
// real-time clock: timestamp() is fixed when the statement starts, so an ask that waited seconds
// for the lock or for a cold server wrote a term that had already ended when it committed, and
// the standby took it at once (found in the chaos-slice run: an ask that took 4.2 s renewed a
// term the standby took 1.3 s later).
// @param leadership: the leadership's name (one per database)
// @param holder: the contender's id (unique per process)
// @param epoch: the contender's current epoch (-1 when it does not lead)
// @param ttl_ms: the term in milliseconds of the server's clock
// @param grace_ms: how long an ended term stands before another contender may take it
// @param outage_grace_ms: added to the grace when the term was first seen ended more than $ttl_ms after its end
MERGE (l:Leader {name: $leadership})
ON CREATE SET l.epoch = 0, l.expires_at_ms = 0, l.holder = null
SET l.asks = coalesce(l.asks, 0) + 1
WITH l, datetime.realtime().epochMillis AS now
WITH l, now, coalesce(l.holder = $holder AND l.epoch = $epoch, false) AS renew, l.expires_at_ms < now AS ended
WITH l, now, renew, ended AND NOT renew AS open
WITH l, now, renew, open,
     open AND (l.expires_at_ms = 0 OR coalesce(now - l.ended_seen_ms >= $grace_ms + CASE
         WHEN l.ended_seen_ms - l.expires_at_ms > $ttl_ms THEN $outage_grace_ms ELSE 0 END, false)) AS take
SET l.epoch = CASE WHEN take THEN l.epoch + 1 ELSE l.epoch END,
    l.since_ms = CASE WHEN take THEN now ELSE l.since_ms END,
    l.holder = CASE WHEN take THEN $holder ELSE l.holder END,
    l.expires_at_ms = CASE WHEN renew OR take THEN now + $ttl_ms ELSE l.expires_at_ms END,
    l.ended_seen_ms = CASE WHEN renew OR take THEN null WHEN open THEN coalesce(l.ended_seen_ms, now)
                      ELSE l.ended_seen_ms END
RETURN l.holder AS holder, l.epoch AS epoch, l.expires_at_ms - now AS left_ms
