// Make a model's weights resident on exactly these devices (its replicas' devices).
// @param model_uid: the model
// @param device_ids: devices holding a copy (may be empty)
MATCH (t:Tensor {model_uid: $model_uid, kind: 'weight'})
OPTIONAL MATCH (t)-[old:RESIDES_ON]->(:Device)
DELETE old
WITH DISTINCT t
UNWIND $device_ids AS device_id
MATCH (d:Device {device_id: device_id})
MERGE (t)-[:RESIDES_ON]->(d)
RETURN count(*) AS placed
