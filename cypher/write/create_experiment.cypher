// Persist an experiment record (a replay or benchmark run) with its config and results as JSON.
// @param uid: experiment id
// @param kind: e.g. replay
// @param config_json: the run's configuration, JSON
// @param results_json: its results, JSON
CREATE (e:Experiment {uid: $uid, kind: $kind, created_at: datetime(), config_json: $config_json,
                      results_json: $results_json})
RETURN e.uid AS uid
