// The leadership's current term: its holder and epoch (the fencing token), checked at the start
// of every write transaction of a leader under election; a deposed leader's write sees another
// holder or a later epoch and is refused.
// @param leadership: the leadership's name
MATCH (l:Leader {name: $leadership})
RETURN l.holder AS holder, l.epoch AS epoch, l.expires_at_ms - timestamp() AS left_ms
