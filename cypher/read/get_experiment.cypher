// One experiment record with everything stored on it (no row: no such uid).
// @param uid: experiment id
MATCH (e:Experiment {uid: $uid})
RETURN e.uid AS uid, e.kind AS kind, coalesce(e.project, 'default') AS project, e.tenant_id AS tenant_id,
       toString(e.created_at) AS created_at, e.seed AS seed, e.code_commit AS code_commit,
       e.code_dirty AS code_dirty, e.code_diff_sha256 AS code_diff_sha256,
       e.code_package_version AS code_package_version, e.cost_model_sha256 AS cost_model_sha256,
       e.out_dir AS out_dir, e.config_json AS config_json, e.data_digests_json AS data_digests_json,
       e.cost_model_json AS cost_model_json, e.results_json AS results_json, e.plots_json AS plots_json
