// Give the leadership up at a clean stop, so that the standby takes over at once instead of
// when the term ends: only the holder of the given epoch can.
// @param leadership: the leadership's name
// @param holder: the holder's id
// @param epoch: its epoch
MATCH (l:Leader {name: $leadership})
WHERE l.holder = $holder AND l.epoch = $epoch
SET l.expires_at_ms = 0
RETURN l.epoch AS epoch
