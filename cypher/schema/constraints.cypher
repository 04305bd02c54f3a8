// Uniqueness constraints of the Global Mapping Graph. Idempotent (IF NOT EXISTS).
// Every uid is "<tenant_id>/<model_id>/..." so one single-property index serves each lookup.
CREATE CONSTRAINT tenant_id IF NOT EXISTS FOR (n:Tenant) REQUIRE n.tenant_id IS UNIQUE;
CREATE CONSTRAINT model_uid IF NOT EXISTS FOR (n:Model) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT operator_uid IF NOT EXISTS FOR (n:Operator) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT tensor_uid IF NOT EXISTS FOR (n:Tensor) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT device_id IF NOT EXISTS FOR (n:Device) REQUIRE n.device_id IS UNIQUE;
CREATE CONSTRAINT host_id IF NOT EXISTS FOR (n:Host) REQUIRE n.host_id IS UNIQUE;
CREATE CONSTRAINT request_uid IF NOT EXISTS FOR (n:Request) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT slice_uid IF NOT EXISTS FOR (n:Slice) REQUIRE n.uid IS UNIQUE
;
CREATE CONSTRAINT experiment_uid IF NOT EXISTS FOR (n:Experiment) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT request_idempotency IF NOT EXISTS FOR (n:Request) REQUIRE (n.tenant_id, n.idempotency_key) IS UNIQUE;
CREATE CONSTRAINT executor_pool_id IF NOT EXISTS FOR (n:ExecutorPool) REQUIRE n.pool_id IS UNIQUE;
CREATE CONSTRAINT api_key_uid IF NOT EXISTS FOR (n:ApiKey) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT api_key_hash IF NOT EXISTS FOR (n:ApiKey) REQUIRE n.key_hash IS UNIQUE;
CREATE CONSTRAINT project_uid IF NOT EXISTS FOR (n:Project) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT access_request_uid IF NOT EXISTS FOR (n:AccessRequest) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT workflow_uid IF NOT EXISTS FOR (n:Workflow) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT workflow_step_uid IF NOT EXISTS FOR (n:WorkflowStep) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT leader_name IF NOT EXISTS FOR (n:Leader) REQUIRE n.name IS UNIQUE
