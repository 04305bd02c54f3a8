// Persist an experiment record (a replay, what-if or benchmark run): scalars as properties, so
// they can be filtered and shown in Cypher; nested maps and lists as JSON strings.
// @param uid: experiment id
// @param kind: replay | whatif | benchmark
// @param project: the project it belongs to (a plain name; "default" unless given)
// @param tenant_id: the tenant it was run for, or null
// @param created_at: ISO 8601 UTC timestamp of the run
// @param seed: the run's seed, or null
// @param code_commit: git commit of the code, or null outside a git checkout
// @param code_dirty: whether tracked files differed from that commit, or null if unknown
// @param code_diff_sha256: SHA-256 of those differences, or null
// @param code_package_version: the installed package version
// @param cost_model_kind: the cost model's kind (learned, gnn, table, roofline)
// @param cost_model_sha256: the cost-model artifact's hash, or null (roofline: no artifact)
// @param out_dir: the run's output folder (report and plots), or null
// @param config_json: the run's full configuration, JSON
// @param data_digests_json: {file: SHA-256} of every data file it read, JSON
// @param cost_model_json: the cost model's description, JSON
// @param results_json: its results, JSON
// @param plots_json: [{name, path, sha256, size_bytes}] of its plots, JSON
CREATE (e:Experiment {uid: $uid, kind: $kind, project: $project, tenant_id: $tenant_id,
                      created_at: datetime($created_at), seed: $seed, code_commit: $code_commit,
                      code_dirty: $code_dirty, code_diff_sha256: $code_diff_sha256,
                      code_package_version: $code_package_version, cost_model_kind: $cost_model_kind,
                      cost_model_sha256: $cost_model_sha256, out_dir: $out_dir, config_json: $config_json,
                      data_digests_json: $data_digests_json, cost_model_json: $cost_model_json,
                      results_json: $results_json, plots_json: $plots_json})
RETURN e.uid AS uid
