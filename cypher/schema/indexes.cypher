// Range indexes for tenant-scoped and per-model lookups. Idempotent (IF NOT EXISTS).
CREATE RANGE INDEX model_tenant IF NOT EXISTS FOR (n:Model) ON (n.tenant_id);
CREATE RANGE INDEX operator_tenant IF NOT EXISTS FOR (n:Operator) ON (n.tenant_id);
CREATE RANGE INDEX operator_model_phase IF NOT EXISTS FOR (n:Operator) ON (n.model_uid, n.phase);
CREATE RANGE INDEX tensor_model_kind IF NOT EXISTS FOR (n:Tensor) ON (n.model_uid, n.kind);
CREATE RANGE INDEX tensor_tenant IF NOT EXISTS FOR (n:Tensor) ON (n.tenant_id);
CREATE RANGE INDEX device_cluster IF NOT EXISTS FOR (n:Device) ON (n.cluster);
CREATE RANGE INDEX device_kind IF NOT EXISTS FOR (n:Device) ON (n.kind);
CREATE RANGE INDEX slice_state_end IF NOT EXISTS FOR (n:Slice) ON (n.state, n.end_s);
CREATE RANGE INDEX slice_tenant IF NOT EXISTS FOR (n:Slice) ON (n.tenant_id);
// Live retention (delete_old_live_slices) seeks the ended slices: no scan of millions per call.
CREATE RANGE INDEX slice_end_wall IF NOT EXISTS FOR (n:Slice) ON (n.end_wall);
CREATE RANGE INDEX host_cluster IF NOT EXISTS FOR (n:Host) ON (n.cluster);
CREATE RANGE INDEX request_tenant_arrival IF NOT EXISTS FOR (n:Request) ON (n.tenant_id, n.arrival);
CREATE RANGE INDEX request_status IF NOT EXISTS FOR (n:Request) ON (n.status);
CREATE RANGE INDEX workflow_tenant IF NOT EXISTS FOR (n:Workflow) ON (n.tenant_id);
CREATE RANGE INDEX workflow_status IF NOT EXISTS FOR (n:Workflow) ON (n.status);
CREATE RANGE INDEX request_finished_at IF NOT EXISTS FOR (n:Request) ON (n.finished_at);
CREATE RANGE INDEX workflow_finished_at IF NOT EXISTS FOR (n:Workflow) ON (n.finished_at);
CREATE RANGE INDEX audit_entry_at IF NOT EXISTS FOR (n:AuditEntry) ON (n.at)
