// Experiment records, newest first, without their bulky JSON (config, results).
// @param project: only this project's, or null for all
// @param projects: only these projects' (a list), or null for all
// @param kind: only this kind (replay, whatif, benchmark), or null for all
// @param tenant_id: only this tenant's, or null for all (those run for no tenant included)
// @param limit: at most this many
MATCH (e:Experiment)
WHERE ($project IS NULL OR coalesce(e.project, 'default') = $project)
  AND ($projects IS NULL OR coalesce(e.project, 'default') IN $projects)
  AND ($kind IS NULL OR e.kind = $kind)
  AND ($tenant_id IS NULL OR e.tenant_id = $tenant_id)
RETURN e.uid AS uid, e.kind AS kind, coalesce(e.project, 'default') AS project, e.tenant_id AS tenant_id,
       toString(e.created_at) AS created_at, e.seed AS seed, e.code_commit AS code_commit,
       e.code_dirty AS code_dirty, e.cost_model_kind AS cost_model_kind, e.out_dir AS out_dir
ORDER BY e.created_at DESC, e.uid
LIMIT $limit
