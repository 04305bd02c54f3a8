// Delete directed device links by their ends.
// @param pairs: [{src, dst}]
UNWIND $pairs AS pair
MATCH (:Device {device_id: pair.src})-[l:LINK]->(:Device {device_id: pair.dst})
DELETE l
RETURN count(*) AS deleted
