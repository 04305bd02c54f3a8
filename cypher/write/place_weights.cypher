// Make a model's weights resident on a device (replacing earlier residence of those weights).
// @param model_uid: the model
// @param device_id: the device that holds them
MATCH (d:Device {device_id: $device_id})
MATCH (t:Tensor {model_uid: $model_uid, kind: 'weight'})
OPTIONAL MATCH (t)-[old:RESIDES_ON]->(:Device)
DELETE old
WITH DISTINCT t, d
MERGE (t)-[:RESIDES_ON]->(d)
RETURN count(t) AS placed
