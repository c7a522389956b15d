//! The 13 flow actions, run against flows in the store.
//!
//! A flow is one record in the collection of its owner's session
//! ([`store::flows`]), child tasks included, so every change to a flow or
//! its tasks is one compare-and-set on its revision: of two writers that
//! read the same revision, exactly one wins, on one instance or many.
//!
//! Every write gives the flow a lifetime ([`WebhookLimits`]): the ended
//! flow retention once it has ended, the idle retention while it has not,
//! counted from that write. An expired flow is gone: not found, not listed,
//! not counted. A session holds at most `max_flows_per_session` flows; the
//! store decides that in the create's own atomic write.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use http::StatusCode;
use serde_json::{Value, json};

use super::flow::{Flow, FlowStatus, MAX_TASKS_PER_FLOW, Task, TaskStatus};
use super::layer::WebhookLimits;
use super::payload::{
    CreateFlow, DEFAULT_LIST_LIMIT, EndFlow, FindLatestFlow, FlowAction, ListFlows, ResumeFlow,
    RunTask, SetWaiting,
};
use crate::clock::{Clock, SystemClock};
use crate::store::SharedStore;
use crate::store::{
    self, Expect, PutOptions, PutOutcome, RecordStoreExt, StoreError, Versioned, WriteOutcome,
};

/// How often a write that lost a race to another writer is tried again
/// when the caller named no revision (`run_task`, `cancel_flow`).
const WRITE_ATTEMPTS: usize = 5;
/// Most stored flows one listing reads while filtering by status.
const MAX_SCANNED_FLOWS: usize = 1000;

/// Who is asking: a route's id, session and controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteScope {
    /// The route's id, named in every answer.
    pub route_id: String,
    /// The session whose flows the route sees.
    pub session_key: String,
    /// The controller the route's flows are managed by.
    pub controller_id: String,
}

/// What an action answered: the status and the `result` object, or a
/// refusal with its `code` and a message for people.
#[derive(Clone, Debug, PartialEq)]
pub enum ActionReply {
    /// Done.
    Done {
        /// 200, 201 (created) or 202 (cancellation pending).
        status: StatusCode,
        /// The `result` object.
        result: Value,
    },
    /// Refused.
    Refused {
        /// 400, 404, 409, 500 or 503.
        status: StatusCode,
        /// `not_found`, `not_managed`, `revision_conflict`, `terminal`,
        /// `cancel_requested`, `task_not_created`, `too_many_flows`,
        /// `invalid_request`, `unavailable` or `internal_error`.
        code: &'static str,
        /// What went wrong and what to do.
        error: String,
        /// The current flow, when there is one to show.
        result: Value,
    },
}

impl ActionReply {
    fn done(status: StatusCode, result: Value) -> Self {
        ActionReply::Done { status, result }
    }

    fn refused(status: StatusCode, code: &'static str, error: impl Into<String>) -> Self {
        ActionReply::Refused {
            status,
            code,
            error: error.into(),
            result: json!({}),
        }
    }

    fn with_flow(mut self, flow: &Versioned<Flow>) -> Self {
        if let ActionReply::Refused { result, .. } = &mut self {
            *result = json!({ "flow": flow.value.view(flow.revision) });
        }
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ActionReply::Done { status, .. } | ActionReply::Refused { status, .. } => *status,
        }
    }
}

/// A child task handed to the host's [`TaskRunner`].
#[derive(Clone, Debug)]
pub struct TaskLaunch {
    /// The route that created it.
    pub route_id: String,
    /// The session that owns its flow.
    pub session_key: String,
    /// Its flow.
    pub flow_id: String,
    /// The task as recorded.
    pub task: Task,
}

/// What the host's runner says about cancelling a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It has stopped: record it cancelled.
    Cancelled,
    /// It is stopping: the host records its end later
    /// ([`FlowActions::set_task_status`]).
    Pending,
}

/// What [`FlowActions::set_task_status`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskUpdate {
    /// The task has its new status.
    Updated,
    /// No such flow in the session, or no such task in the flow.
    NoSuchTask,
    /// The task had already ended (with this status) and keeps its ending.
    AlreadyEnded(TaskStatus),
}

/// Why a runner would not start a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRunnerError(pub String);

impl fmt::Display for TaskRunnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Runs child tasks for the host. A task is recorded before it is started,
/// so a crash between the two loses nothing: the task stays queued.
#[async_trait]
pub trait TaskRunner: Send + Sync + 'static {
    /// Starts a recorded task. `Ok(Some(status))` records a new status
    /// (`running`, say); `Ok(None)` leaves it as it is; an error records
    /// the task failed and answers 409 `task_not_created`.
    async fn start(&self, launch: &TaskLaunch) -> Result<Option<TaskStatus>, TaskRunnerError>;

    /// Stops an active task.
    async fn cancel(&self, launch: &TaskLaunch) -> CancelOutcome;
}

/// The default runner: tasks are only recorded (as queued) for the host to
/// pick up; cancelling one that has not ended just records it cancelled.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordOnly;

#[async_trait]
impl TaskRunner for RecordOnly {
    async fn start(&self, _launch: &TaskLaunch) -> Result<Option<TaskStatus>, TaskRunnerError> {
        Ok(None)
    }

    async fn cancel(&self, _launch: &TaskLaunch) -> CancelOutcome {
        CancelOutcome::Cancelled
    }
}

/// Runs flow actions for routes, against flows in a store.
#[derive(Clone)]
pub struct FlowActions {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    runner: Arc<dyn TaskRunner>,
    limits: WebhookLimits,
}

impl fmt::Debug for FlowActions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowActions")
            .field("clock", &self.clock)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A refusal on the way to an answer; `?` carries it out.
type Step<T> = Result<T, ActionReply>;

impl FlowActions {
    /// Actions on flows in `store`, with the system clock, [`RecordOnly`]
    /// and the default [`WebhookLimits`].
    pub fn new(store: SharedStore) -> Self {
        FlowActions {
            store,
            clock: Arc::new(SystemClock),
            runner: Arc::new(RecordOnly),
            limits: WebhookLimits::default(),
        }
    }

    /// Keeps flows for the retentions of `limits`, and at most its
    /// `max_flows_per_session` per session (its other fields are the
    /// layer's).
    pub fn limits(mut self, limits: WebhookLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Takes time from `clock` (timestamps of flows and tasks, and the
    /// instant their lifetimes are judged at).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Hands new tasks to `runner`.
    pub fn task_runner(mut self, runner: Arc<dyn TaskRunner>) -> Self {
        self.runner = runner;
        self
    }

    /// Runs `action` for `route`.
    pub async fn execute(&self, route: &RouteScope, action: FlowAction) -> ActionReply {
        let reply = match action {
            FlowAction::CreateFlow(create) => self.create_flow(route, create).await,
            FlowAction::GetFlow(get) => self.get_flow(route, get.flow_id.as_str()).await,
            FlowAction::ListFlows(list) => self.list_flows(route, list).await,
            FlowAction::FindLatestFlow(FindLatestFlow { status }) => {
                self.latest_flow(route, status).await
            }
            FlowAction::ResolveFlow(resolve) => {
                if resolve.token.as_str() == route.session_key {
                    self.latest_flow(route, None).await
                } else {
                    self.get_flow(route, resolve.token.as_str()).await
                }
            }
            FlowAction::GetTaskSummary(get) => self
                .load(route, get.flow_id.as_str())
                .await
                .map(|flow| ActionReply::done(StatusCode::OK, flow.value.task_summary())),
            FlowAction::SetWaiting(set) => self.set_waiting(route, set).await,
            FlowAction::ResumeFlow(resume) => self.resume_flow(route, resume).await,
            FlowAction::FinishFlow(end) => self.end_flow(route, end, FlowStatus::Succeeded).await,
            FlowAction::FailFlow(end) => self.end_flow(route, end, FlowStatus::Failed).await,
            FlowAction::RequestCancel(request) => {
                let now = self.clock.now();
                self.revise(
                    route,
                    request.flow_id.as_str(),
                    request.expected_revision.0,
                    |flow| {
                        flow.cancel_requested_at.get_or_insert(now);
                        flow.updated_at = now;
                        Ok(())
                    },
                )
                .await
            }
            FlowAction::CancelFlow(cancel) => {
                self.cancel_flow(route, cancel.flow_id.as_str()).await
            }
            FlowAction::RunTask(run) => self.run_task(route, run).await,
        };
        reply.unwrap_or_else(|refusal| refusal)
    }

    /// Records a task's new status, for a host whose runner reports back
    /// (a task that finished, or stopped after a pending cancellation).
    /// When a cancelled flow's last active task ends, the flow is
    /// cancelled too. A task that has ended keeps its ending.
    pub async fn set_task_status(
        &self,
        session_key: &str,
        flow_id: &str,
        task_id: &str,
        status: TaskStatus,
        error: Option<String>,
    ) -> Result<TaskUpdate, StoreError> {
        let now = self.clock.now();
        let outcome = self
            .update(&store::flows(session_key), flow_id, |flow| {
                let Some(task) = flow.tasks.iter_mut().find(|task| task.task_id == task_id) else {
                    return Change::Keep(TaskUpdate::NoSuchTask);
                };
                if task.status.is_terminal() {
                    return Change::Keep(TaskUpdate::AlreadyEnded(task.status));
                }
                task.status = status;
                task.error.clone_from(&error);
                task.updated_at = now;
                settle_cancellation(flow, now);
                Change::Write(TaskUpdate::Updated)
            })
            .await?;
        match outcome {
            Updated::Missing => Ok(TaskUpdate::NoSuchTask),
            Updated::Done(_, update) => Ok(update),
            Updated::Busy(_) => Err(StoreError::invalid(
                "set_task_status",
                "the flow kept changing under concurrent writers",
            )),
        }
    }

    /// Reads the flow, applies `change` and writes it at the revision read,
    /// again from a fresh read when another writer came first, up to
    /// [`WRITE_ATTEMPTS`] times.
    async fn update<T>(
        &self,
        collection: &str,
        flow_id: &str,
        mut change: impl FnMut(&mut Flow) -> Change<T>,
    ) -> Result<Updated<T>, StoreError> {
        let mut last = None;
        for _ in 0..WRITE_ATTEMPTS {
            let Some(mut flow) = self
                .store
                .get_json_at::<Flow>(collection, flow_id, self.clock.now())
                .await?
            else {
                return Ok(Updated::Missing);
            };
            let outcome = match change(&mut flow.value) {
                Change::Keep(outcome) => return Ok(Updated::Done(flow, outcome)),
                Change::Write(outcome) => outcome,
            };
            match self
                .put_flow(collection, &flow.value, Expect::Revision(flow.revision))
                .await?
            {
                WriteOutcome::Written { revision } => {
                    flow.revision = revision;
                    return Ok(Updated::Done(flow, outcome));
                }
                WriteOutcome::Conflict { .. } => last = Some(flow),
            }
        }
        Ok(Updated::Busy(last.expect("at least one attempt")))
    }

    async fn create_flow(&self, route: &RouteScope, create: CreateFlow) -> Step<ActionReply> {
        let now = self.clock.now();
        let flow = Flow {
            flow_id: random_id("flow"),
            owner_key: route.session_key.clone(),
            requester_origin: route.route_id.clone(),
            controller_id: route.controller_id.clone(),
            goal: create.goal.into_string(),
            status: create.status.unwrap_or(FlowStatus::Queued),
            notify_policy: create.notify_policy.unwrap_or_default(),
            current_step: create.current_step.map(|step| step.into_string()),
            state_json: create.state_json,
            wait_json: create.wait_json,
            blocked_task_id: None,
            blocked_summary: None,
            error: None,
            cancel_requested_at: None,
            created_at: now,
            updated_at: now,
            ended_at: None,
            tasks: Vec::new(),
        };
        let cap = self.limits.max_flows_per_session;
        let outcome = self
            .store
            .put_json_at(
                &store::flows(&route.session_key),
                &flow.flow_id,
                &flow,
                Expect::Absent,
                self.lifetime(&flow).max_records(cap),
                now,
            )
            .await
            .map_err(|error| unavailable(route, &error))?;
        match outcome {
            PutOutcome::Write(WriteOutcome::Written { revision }) => Ok(ActionReply::done(
                StatusCode::CREATED,
                json!({ "flow": flow.view(revision) }),
            )),
            // 144 random bits: a collision means the store is broken.
            PutOutcome::Write(WriteOutcome::Conflict { .. }) => {
                Err(internal("a new flow id was already taken"))
            }
            PutOutcome::Full { .. } => Err(ActionReply::refused(
                StatusCode::CONFLICT,
                "too_many_flows",
                format!(
                    "this session already holds {cap} flows, the most it may; end the flows \
                     it no longer needs (finish_flow, fail_flow or cancel_flow): an ended flow \
                     stops counting {} after it ends, and one left unchanged stops counting {} \
                     after its last change",
                    describe(self.limits.ended_flow_retention),
                    describe(self.limits.idle_flow_retention),
                ),
            )),
        }
    }

    /// How long `flow` is kept from this write on: the ended flow retention
    /// once it has ended, the idle retention while it has not.
    fn lifetime(&self, flow: &Flow) -> PutOptions {
        PutOptions::expiring(if flow.status.is_terminal() {
            self.limits.ended_flow_retention
        } else {
            self.limits.idle_flow_retention
        })
    }

    /// Writes a flow that exists (no cap applies) when `expect` holds,
    /// giving it its lifetime afresh.
    async fn put_flow(
        &self,
        collection: &str,
        flow: &Flow,
        expect: Expect,
    ) -> Result<WriteOutcome, StoreError> {
        self.store
            .put_json_at(
                collection,
                &flow.flow_id,
                flow,
                expect,
                self.lifetime(flow),
                self.clock.now(),
            )
            .await?
            .uncapped()
    }

    async fn get_flow(&self, route: &RouteScope, flow_id: &str) -> Step<ActionReply> {
        let flow = self.load(route, flow_id).await?;
        Ok(ActionReply::done(
            StatusCode::OK,
            json!({ "flow": flow.value.view(flow.revision) }),
        ))
    }

    async fn list_flows(&self, route: &RouteScope, list: ListFlows) -> Step<ActionReply> {
        let limit = list.limit.unwrap_or(DEFAULT_LIST_LIMIT);
        let flows = self.newest_flows(route, list.status, limit).await?;
        let views: Vec<Value> = flows
            .iter()
            .map(|flow| flow.value.view(flow.revision))
            .collect();
        Ok(ActionReply::done(
            StatusCode::OK,
            json!({ "count": views.len(), "flows": views }),
        ))
    }

    async fn latest_flow(
        &self,
        route: &RouteScope,
        status: Option<FlowStatus>,
    ) -> Step<ActionReply> {
        match self.newest_flows(route, status, 1).await?.pop() {
            Some(flow) => Ok(ActionReply::done(
                StatusCode::OK,
                json!({ "flow": flow.value.view(flow.revision) }),
            )),
            None => Err(ActionReply::refused(
                StatusCode::NOT_FOUND,
                "not_found",
                "no flow found for this route's session",
            )),
        }
    }

    /// Up to `limit` of the session's flows, newest first, with `status` if given.
    async fn newest_flows(
        &self,
        route: &RouteScope,
        status: Option<FlowStatus>,
        limit: usize,
    ) -> Step<Vec<Versioned<Flow>>> {
        let collection = store::flows(&route.session_key);
        let page = if status.is_some() { 100 } else { limit };
        let mut found = Vec::new();
        let mut offset = 0;
        // One instant for every page: a flow expiring between two pages
        // would otherwise shift the offsets and skip a live one.
        let now = self.clock.now();
        while found.len() < limit && offset < MAX_SCANNED_FLOWS {
            let records = self
                .store
                .list_records_at(&collection, offset, page, now)
                .await
                .map_err(|error| unavailable(route, &error))?;
            let exhausted = records.len() < page;
            offset += records.len();
            for (_, record) in records {
                let flow: Versioned<Flow> = store::decode("list_records", record)
                    .map_err(|error| corrupt(route, &error))?;
                if status.is_none_or(|status| flow.value.status == status) {
                    found.push(flow);
                }
            }
            if exhausted {
                break;
            }
        }
        found.truncate(limit);
        Ok(found)
    }

    async fn set_waiting(&self, route: &RouteScope, set: SetWaiting) -> Step<ActionReply> {
        let now = self.clock.now();
        let blocked_task_id = set.blocked_task_id.map(|id| id.into_string());
        let blocked_summary = set.blocked_summary.map(|text| text.into_string());
        self.revise(
            route,
            set.flow_id.as_str(),
            set.expected_revision.0,
            |flow| {
                if let Some(task_id) = &blocked_task_id
                    && !flow.tasks.iter().any(|task| &task.task_id == task_id)
                {
                    return Err(ActionReply::refused(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        format!("task {task_id:?} is not a task of this flow"),
                    ));
                }
                flow.status = if blocked_task_id.is_some() || blocked_summary.is_some() {
                    FlowStatus::Blocked
                } else {
                    FlowStatus::Waiting
                };
                flow.blocked_task_id = blocked_task_id;
                flow.blocked_summary = blocked_summary;
                if let Some(step) = set.current_step {
                    flow.current_step = Some(step.into_string());
                }
                if set.state_json.is_some() {
                    flow.state_json = set.state_json;
                }
                if set.wait_json.is_some() {
                    flow.wait_json = set.wait_json;
                }
                flow.updated_at = now;
                Ok(())
            },
        )
        .await
    }

    async fn resume_flow(&self, route: &RouteScope, resume: ResumeFlow) -> Step<ActionReply> {
        let now = self.clock.now();
        self.revise(
            route,
            resume.flow_id.as_str(),
            resume.expected_revision.0,
            |flow| {
                if flow.cancel_requested_at.is_some() {
                    return Err(ActionReply::refused(
                        StatusCode::CONFLICT,
                        "cancel_requested",
                        "a cancellation was requested for this flow: it cannot resume",
                    ));
                }
                flow.status = resume.status.unwrap_or(FlowStatus::Running);
                flow.wait_json = None;
                flow.blocked_task_id = None;
                flow.blocked_summary = None;
                if let Some(step) = resume.current_step {
                    flow.current_step = Some(step.into_string());
                }
                if resume.state_json.is_some() {
                    flow.state_json = resume.state_json;
                }
                flow.updated_at = now;
                Ok(())
            },
        )
        .await
    }

    async fn end_flow(
        &self,
        route: &RouteScope,
        end: EndFlow,
        ending: FlowStatus,
    ) -> Step<ActionReply> {
        let now = self.clock.now();
        self.revise(
            route,
            end.flow_id.as_str(),
            end.expected_revision.0,
            |flow| {
                flow.status = ending;
                flow.error = end.error.map(|error| error.into_string());
                if end.state_json.is_some() {
                    flow.state_json = end.state_json;
                }
                flow.wait_json = None;
                flow.updated_at = now;
                flow.ended_at = Some(now);
                Ok(())
            },
        )
        .await
    }

    /// A change to a live flow the route manages, at the caller's revision.
    async fn revise(
        &self,
        route: &RouteScope,
        flow_id: &str,
        expected_revision: u64,
        change: impl FnOnce(&mut Flow) -> Step<()>,
    ) -> Step<ActionReply> {
        let mut flow = self.load_managed(route, flow_id).await?;
        if flow.revision != expected_revision {
            return Err(revision_conflict(expected_revision, &flow));
        }
        refuse_if_ended(&flow)?;
        change(&mut flow.value)?;
        match self.write(route, &flow).await? {
            Ok(revision) => Ok(ActionReply::done(
                StatusCode::OK,
                json!({ "flow": flow.value.view(revision) }),
            )),
            Err(current) => Err(revision_conflict(expected_revision, &current)),
        }
    }

    /// Marks the flow cancelled-requested, asks the runner once to stop
    /// each active task, then records what it stopped: the runner is never
    /// asked twice, whatever other writers do meanwhile.
    async fn cancel_flow(&self, route: &RouteScope, flow_id: &str) -> Step<ActionReply> {
        let collection = store::flows(&route.session_key);
        let now = self.clock.now();
        self.load_managed(route, flow_id).await?;
        let requested = self
            .update(&collection, flow_id, |flow| {
                if flow.status.is_terminal() {
                    return Change::Keep(false);
                }
                if flow.cancel_requested_at.is_some() {
                    return Change::Keep(true);
                }
                flow.cancel_requested_at = Some(now);
                flow.updated_at = now;
                Change::Write(true)
            })
            .await
            .map_err(|error| unavailable(route, &error))?;
        let flow = self.settled(requested)?;
        let active: Vec<Task> = flow
            .value
            .tasks
            .iter()
            .filter(|task| !task.status.is_terminal())
            .cloned()
            .collect();
        let mut stopped = Vec::new();
        for task in &active {
            let launch = self.launch(route, &flow.value, task);
            if self.runner.cancel(&launch).await == CancelOutcome::Cancelled {
                stopped.push(task.task_id.clone());
            }
        }
        let recorded = self
            .update(&collection, flow_id, |flow| {
                if flow.status.is_terminal() {
                    return Change::Keep(false);
                }
                for task in &mut flow.tasks {
                    if !task.status.is_terminal() && stopped.contains(&task.task_id) {
                        task.status = FlowStatus::Cancelled;
                        task.updated_at = now;
                    }
                }
                settle_cancellation(flow, now);
                flow.updated_at = now;
                Change::Write(true)
            })
            .await
            .map_err(|error| unavailable(route, &error))?;
        let flow = self.settled(recorded)?;
        let view = flow.value.view(flow.revision);
        Ok(if flow.value.status == FlowStatus::Cancelled {
            ActionReply::done(
                StatusCode::OK,
                json!({ "outcome": "cancelled", "flow": view }),
            )
        } else {
            let active = flow
                .value
                .tasks
                .iter()
                .filter(|task| !task.status.is_terminal())
                .count();
            ActionReply::done(
                StatusCode::ACCEPTED,
                json!({ "outcome": "cancel_pending", "activeTasks": active, "flow": view }),
            )
        })
    }

    /// The flow an update left, refusing when it was gone, had ended (the
    /// change said `false`) or kept changing.
    fn settled(&self, updated: Updated<bool>) -> Step<Versioned<Flow>> {
        match updated {
            Updated::Missing => Err(ActionReply::refused(
                StatusCode::NOT_FOUND,
                "not_found",
                "the flow was removed",
            )),
            Updated::Done(flow, true) => Ok(flow),
            Updated::Done(flow, false) => {
                refuse_if_ended(&flow)?;
                Ok(flow)
            }
            Updated::Busy(flow) => Err(busy(&flow)),
        }
    }

    async fn run_task(&self, route: &RouteScope, run: RunTask) -> Step<ActionReply> {
        if let Some(child) = &run.child_session_key {
            let child = child.as_str();
            let within = child == route.session_key
                || child
                    .strip_prefix(route.session_key.as_str())
                    .is_some_and(|rest| rest.starts_with(':'));
            if !within {
                return Err(ActionReply::refused(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "`childSessionKey` must be the route's session or a session under it \
                     (the route's session key followed by `:`)",
                ));
            }
        }
        let run_id = run.run_id.map(|id| id.into_string());
        let mut last = None;
        for _ in 0..WRITE_ATTEMPTS {
            let mut flow = self.load_managed(route, run.flow_id.as_str()).await?;
            if let Some(existing) = run_id.as_deref().and_then(|run_id| {
                flow.value
                    .tasks
                    .iter()
                    .find(|task| task.run_id.as_deref() == Some(run_id))
            }) {
                // A retry of a run that was recorded: the same task, not a second one.
                return Ok(ActionReply::done(
                    StatusCode::OK,
                    json!({ "created": false, "task": existing.view(), "flow": flow.value.view(flow.revision) }),
                ));
            }
            refuse_if_ended(&flow)?;
            if flow.value.cancel_requested_at.is_some() {
                return Err(ActionReply::refused(
                    StatusCode::CONFLICT,
                    "cancel_requested",
                    "a cancellation was requested for this flow: it takes no new tasks",
                )
                .with_flow(&flow));
            }
            if flow.value.tasks.len() >= MAX_TASKS_PER_FLOW {
                return Err(ActionReply::refused(
                    StatusCode::CONFLICT,
                    "task_not_created",
                    format!("a flow holds at most {MAX_TASKS_PER_FLOW} tasks; start a new flow"),
                )
                .with_flow(&flow));
            }
            let now = self.clock.now();
            let task = Task {
                task_id: random_id("task"),
                run_id: run_id.clone(),
                runtime: run.runtime,
                task: run.task.as_str().to_owned(),
                label: run.label.as_ref().map(|label| label.as_str().to_owned()),
                child_session_key: run
                    .child_session_key
                    .as_ref()
                    .map(|child| child.as_str().to_owned()),
                status: run.status.unwrap_or(FlowStatus::Queued),
                error: None,
                created_at: now,
                updated_at: now,
            };
            flow.value.tasks.push(task.clone());
            flow.value.updated_at = now;
            match self.write(route, &flow).await? {
                Ok(revision) => {
                    flow.revision = revision;
                    return self.start_task(route, flow, task).await;
                }
                Err(current) => last = Some(current),
            }
        }
        Err(busy(&last.expect("at least one attempt")))
    }

    /// Hands a recorded task to the runner and records what it says.
    async fn start_task(
        &self,
        route: &RouteScope,
        mut flow: Versioned<Flow>,
        mut task: Task,
    ) -> Step<ActionReply> {
        let launch = self.launch(route, &flow.value, &task);
        let (status, error) = match self.runner.start(&launch).await {
            Ok(None) => {
                return Ok(ActionReply::done(
                    StatusCode::CREATED,
                    json!({ "created": true, "task": task.view(), "flow": flow.value.view(flow.revision) }),
                ));
            }
            Ok(Some(status)) => (status, None),
            Err(error) => (FlowStatus::Failed, Some(error.0)),
        };
        let update = self
            .set_task_status(
                &route.session_key,
                &flow.value.flow_id,
                &task.task_id,
                status,
                error.clone(),
            )
            .await
            .map_err(|error| unavailable(route, &error))?;
        if let TaskUpdate::AlreadyEnded(_) = update {
            // Cancelled while it was being started: stop what the runner began.
            if error.is_none() {
                self.runner.cancel(&launch).await;
            }
        }
        flow = self.load(route, &flow.value.flow_id).await?;
        if let Some(recorded) = flow
            .value
            .tasks
            .iter()
            .find(|recorded| recorded.task_id == task.task_id)
        {
            task = recorded.clone();
        }
        match error {
            None => Ok(ActionReply::done(
                StatusCode::CREATED,
                json!({ "created": true, "task": task.view(), "flow": flow.value.view(flow.revision) }),
            )),
            Some(reason) => Err(ActionReply::refused(
                StatusCode::CONFLICT,
                "task_not_created",
                format!("the task runner refused the task: {reason}"),
            )
            .with_flow(&flow)),
        }
    }

    fn launch(&self, route: &RouteScope, flow: &Flow, task: &Task) -> TaskLaunch {
        TaskLaunch {
            route_id: route.route_id.clone(),
            session_key: route.session_key.clone(),
            flow_id: flow.flow_id.clone(),
            task: task.clone(),
        }
    }

    /// The flow, when the route's session owns it; `not_found` otherwise
    /// (another session's flow is indistinguishable from none).
    async fn load(&self, route: &RouteScope, flow_id: &str) -> Step<Versioned<Flow>> {
        match self
            .store
            .get_json_at::<Flow>(&store::flows(&route.session_key), flow_id, self.clock.now())
            .await
        {
            Ok(Some(flow)) => Ok(flow),
            Ok(None) => Err(ActionReply::refused(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("flow {:?} was not found", truncate(flow_id)),
            )),
            Err(error) if error.is_unavailable() => Err(unavailable(route, &error)),
            Err(error) => Err(corrupt(route, &error)),
        }
    }

    /// The flow, when the route's controller manages it.
    async fn load_managed(&self, route: &RouteScope, flow_id: &str) -> Step<Versioned<Flow>> {
        let flow = self.load(route, flow_id).await?;
        if flow.value.controller_id != route.controller_id {
            return Err(ActionReply::refused(
                StatusCode::CONFLICT,
                "not_managed",
                "this flow is managed by another controller: this route may read it but not change it",
            ));
        }
        Ok(flow)
    }

    /// Writes the flow at the revision it was read at: `Ok(new revision)`,
    /// or `Err(current flow)` when another writer came first.
    async fn write(
        &self,
        route: &RouteScope,
        flow: &Versioned<Flow>,
    ) -> Step<Result<u64, Versioned<Flow>>> {
        let outcome = self
            .put_flow(
                &store::flows(&route.session_key),
                &flow.value,
                Expect::Revision(flow.revision),
            )
            .await
            .map_err(|error| unavailable(route, &error))?;
        match outcome {
            WriteOutcome::Written { revision } => Ok(Ok(revision)),
            WriteOutcome::Conflict {
                current: Some(current),
            } => Ok(Err(
                store::decode("put_record", current).map_err(|error| corrupt(route, &error))?
            )),
            WriteOutcome::Conflict { current: None } => Err(ActionReply::refused(
                StatusCode::NOT_FOUND,
                "not_found",
                "the flow was removed",
            )),
        }
    }
}

/// A cancelled flow whose tasks have all ended is cancelled itself.
fn settle_cancellation(flow: &mut Flow, now: chrono::DateTime<chrono::Utc>) {
    if flow.cancel_requested_at.is_some() && !flow.status.is_terminal() && !flow.has_active_tasks()
    {
        flow.status = FlowStatus::Cancelled;
        flow.ended_at = Some(now);
        flow.updated_at = now;
    }
}

fn refuse_if_ended(flow: &Versioned<Flow>) -> Step<()> {
    if flow.value.status.is_terminal() {
        return Err(ActionReply::refused(
            StatusCode::CONFLICT,
            "terminal",
            format!(
                "the flow has ended ({}): it cannot change any more",
                flow.value.status.as_str()
            ),
        )
        .with_flow(flow));
    }
    Ok(())
}

fn revision_conflict(expected: u64, current: &Versioned<Flow>) -> ActionReply {
    ActionReply::refused(
        StatusCode::CONFLICT,
        "revision_conflict",
        format!(
            "the flow is at revision {}, not {expected}: read it again and retry with its revision",
            current.revision
        ),
    )
    .with_flow(current)
}

fn busy(current: &Versioned<Flow>) -> ActionReply {
    ActionReply::refused(
        StatusCode::CONFLICT,
        "revision_conflict",
        "the flow kept changing while this request ran; retry",
    )
    .with_flow(current)
}

/// What a change to a flow decided: write it (and answer `T`), or keep it
/// as it is.
enum Change<T> {
    Write(T),
    Keep(T),
}

/// How an update ended.
enum Updated<T> {
    /// No such flow.
    Missing,
    /// Written, or kept as it was: the flow as it now stands.
    Done(Versioned<Flow>, T),
    /// Other writers won every attempt: the flow as last read.
    Busy(Versioned<Flow>),
}

fn unavailable(route: &RouteScope, error: &StoreError) -> ActionReply {
    tracing::warn!(route = %route.route_id, %error, "webhook flow store unavailable");
    ActionReply::refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the flow store is unavailable; retry shortly",
    )
}

fn corrupt(route: &RouteScope, error: &StoreError) -> ActionReply {
    tracing::error!(route = %route.route_id, %error, "webhook flow record unreadable");
    internal("a stored flow could not be read")
}

fn internal(message: &str) -> ActionReply {
    ActionReply::refused(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
}

fn random_id(kind: &str) -> String {
    let random = crate::random::alphanumeric(24);
    format!("{kind}-{random}")
}

fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A retention for people: whole days, hours or minutes when it is one,
/// else seconds.
fn describe(duration: std::time::Duration) -> String {
    let seconds = duration.as_secs();
    let (count, unit) = match seconds {
        0 => (0, "second"),
        _ if seconds.is_multiple_of(86_400) => (seconds / 86_400, "day"),
        _ if seconds.is_multiple_of(3_600) => (seconds / 3_600, "hour"),
        _ if seconds.is_multiple_of(60) => (seconds / 60, "minute"),
        _ => (seconds, "second"),
    };
    if count == 1 {
        format!("1 {unit}")
    } else {
        format!("{count} {unit}s")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::store::MemoryStore;

    fn route(route_id: &str, session_key: &str, controller_id: &str) -> RouteScope {
        RouteScope {
            route_id: route_id.into(),
            session_key: session_key.into(),
            controller_id: controller_id.into(),
        }
    }

    fn main_route() -> RouteScope {
        route("deploys", "agent:main", "webhooks/deploys")
    }

    async fn act(actions: &FlowActions, route: &RouteScope, payload: Value) -> (u16, Value) {
        let action = FlowAction::parse(payload.to_string().as_bytes()).unwrap();
        match actions.execute(route, action).await {
            ActionReply::Done { status, result } => (status.as_u16(), result),
            ActionReply::Refused {
                status,
                code,
                result,
                ..
            } => (status.as_u16(), json!({"code": code, "result": result})),
        }
    }

    async fn created(actions: &FlowActions, route: &RouteScope, goal: &str) -> String {
        let (status, result) = act(
            actions,
            route,
            json!({"action": "create_flow", "goal": goal}),
        )
        .await;
        assert_eq!(status, 201, "{result}");
        result["flow"]["flowId"].as_str().unwrap().to_owned()
    }

    fn actions() -> FlowActions {
        FlowActions::new(Arc::new(MemoryStore::new()))
    }

    #[tokio::test]
    async fn flows_are_created_read_listed_and_resolved() {
        let actions = actions();
        let route = main_route();
        let first = created(&actions, &route, "first").await;
        let second = created(&actions, &route, "second").await;
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "get_flow", "flowId": first}),
        )
        .await;
        assert_eq!((status, &result["flow"]["goal"]), (200, &json!("first")));
        assert_eq!(result["flow"]["revision"], 1);
        let (_, listed) = act(&actions, &route, json!({"action": "list_flows"})).await;
        let ids: Vec<_> = listed["flows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|flow| flow["flowId"].clone())
            .collect();
        assert_eq!(ids, [json!(second), json!(first)], "newest first");
        let (_, latest) = act(&actions, &route, json!({"action": "find_latest_flow"})).await;
        assert_eq!(latest["flow"]["flowId"], json!(second));
        let (_, by_session) = act(
            &actions,
            &route,
            json!({"action": "resolve_flow", "token": "agent:main"}),
        )
        .await;
        assert_eq!(by_session["flow"]["flowId"], json!(second));
        let (_, by_id) = act(
            &actions,
            &route,
            json!({"action": "resolve_flow", "token": first}),
        )
        .await;
        assert_eq!(by_id["flow"]["flowId"], json!(first));
        let (status, missing) = act(
            &actions,
            &route,
            json!({"action": "resolve_flow", "token": "nope"}),
        )
        .await;
        assert_eq!((status, &missing["code"]), (404, &json!("not_found")));
        let (_, one) = act(
            &actions,
            &route,
            json!({"action": "list_flows", "limit": 1, "status": "queued"}),
        )
        .await;
        assert_eq!(one["count"], 1);
        let (status, none) = act(
            &actions,
            &route,
            json!({"action": "find_latest_flow", "status": "failed"}),
        )
        .await;
        assert_eq!((status, &none["code"]), (404, &json!("not_found")));
    }

    #[tokio::test]
    async fn another_sessions_flow_is_not_found_and_another_controller_may_only_read() {
        let actions = actions();
        let flow = created(&actions, &main_route(), "mine").await;
        let stranger = route("other", "agent:other", "webhooks/other");
        let (status, result) = act(
            &actions,
            &stranger,
            json!({"action": "get_flow", "flowId": flow}),
        )
        .await;
        assert_eq!((status, &result["code"]), (404, &json!("not_found")));
        let (_, listed) = act(&actions, &stranger, json!({"action": "list_flows"})).await;
        assert_eq!(listed["count"], 0);
        let sibling = route("sibling", "agent:main", "webhooks/sibling");
        let (status, _) = act(
            &actions,
            &sibling,
            json!({"action": "get_flow", "flowId": flow}),
        )
        .await;
        assert_eq!(status, 200);
        let (status, result) = act(
            &actions,
            &sibling,
            json!({"action": "finish_flow", "flowId": flow, "expectedRevision": 1}),
        )
        .await;
        assert_eq!((status, &result["code"]), (409, &json!("not_managed")));
    }

    #[tokio::test]
    async fn mutations_follow_the_state_machine_and_revisions() {
        let actions = actions();
        let route = main_route();
        let flow = created(&actions, &route, "g").await;
        let (status, result) = act(&actions, &route, json!({"action": "set_waiting", "flowId": flow, "expectedRevision": 1, "waitJson": {"for": "approval"}})).await;
        assert_eq!(
            (
                status,
                &result["flow"]["status"],
                &result["flow"]["revision"]
            ),
            (200, &json!("waiting"), &json!(2))
        );
        // A stale revision is refused with the current flow.
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "resume_flow", "flowId": flow, "expectedRevision": 1}),
        )
        .await;
        assert_eq!(
            (status, &result["code"]),
            (409, &json!("revision_conflict"))
        );
        assert_eq!(result["result"]["flow"]["revision"], 2);
        let (status, result) = act(&actions, &route, json!({"action": "set_waiting", "flowId": flow, "expectedRevision": 2, "blockedSummary": "needs a key"})).await;
        assert_eq!(
            (status, &result["flow"]["status"]),
            (200, &json!("blocked"))
        );
        let (status, result) = act(&actions, &route, json!({"action": "set_waiting", "flowId": flow, "expectedRevision": 3, "blockedTaskId": "task-none"})).await;
        assert_eq!((status, &result["code"]), (404, &json!("not_found")));
        let (status, result) = act(&actions, &route, json!({"action": "resume_flow", "flowId": flow, "expectedRevision": 3, "status": "queued"})).await;
        assert_eq!((status, &result["flow"]["status"]), (200, &json!("queued")));
        assert!(result["flow"].get("blockedSummary").is_none());
        assert!(result["flow"].get("waitJson").is_none());
        let (status, result) = act(&actions, &route, json!({"action": "finish_flow", "flowId": flow, "expectedRevision": 4, "stateJson": {"done": true}})).await;
        assert_eq!(
            (status, &result["flow"]["status"]),
            (200, &json!("succeeded"))
        );
        assert!(result["flow"]["endedAt"].is_string());
        for payload in [
            json!({"action": "set_waiting", "flowId": flow, "expectedRevision": 5}),
            json!({"action": "fail_flow", "flowId": flow, "expectedRevision": 5}),
            json!({"action": "request_cancel", "flowId": flow, "expectedRevision": 5}),
            json!({"action": "cancel_flow", "flowId": flow}),
            json!({"action": "run_task", "flowId": flow, "runtime": "acp", "task": "t"}),
        ] {
            let (status, result) = act(&actions, &route, payload.clone()).await;
            assert_eq!(
                (status, &result["code"]),
                (409, &json!("terminal")),
                "{payload}"
            );
        }
        let failing = created(&actions, &route, "f").await;
        let (status, result) = act(&actions, &route, json!({"action": "fail_flow", "flowId": failing, "expectedRevision": 1, "error": "boom"})).await;
        assert_eq!(
            (status, &result["flow"]["status"], &result["flow"]["error"]),
            (200, &json!("failed"), &json!("boom"))
        );
    }

    #[tokio::test]
    async fn a_cancel_request_stops_new_tasks_and_resumes() {
        let actions = actions();
        let route = main_route();
        let flow = created(&actions, &route, "g").await;
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "request_cancel", "flowId": flow, "expectedRevision": 1}),
        )
        .await;
        assert_eq!(status, 200);
        assert!(result["flow"]["cancelRequestedAt"].is_string());
        assert_eq!(result["flow"]["status"], "queued");
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "run_task", "flowId": flow, "runtime": "acp", "task": "t"}),
        )
        .await;
        assert_eq!((status, &result["code"]), (409, &json!("cancel_requested")));
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "resume_flow", "flowId": flow, "expectedRevision": 2}),
        )
        .await;
        assert_eq!((status, &result["code"]), (409, &json!("cancel_requested")));
    }

    #[tokio::test]
    async fn run_task_records_tasks_idempotently_within_the_session() {
        let actions = actions();
        let route = main_route();
        let flow = created(&actions, &route, "g").await;
        let payload = json!({"action": "run_task", "flowId": flow, "runtime": "subagent", "task": "build",
            "runId": "run-1", "label": "Build", "childSessionKey": "agent:main:build"});
        let (status, first) = act(&actions, &route, payload.clone()).await;
        assert_eq!(
            (status, &first["created"], &first["task"]["status"]),
            (201, &json!(true), &json!("queued"))
        );
        assert!(first["task"].get("childSessionKey").is_none());
        let (status, again) = act(&actions, &route, payload).await;
        assert_eq!((status, &again["created"]), (200, &json!(false)));
        assert_eq!(again["task"]["taskId"], first["task"]["taskId"]);
        assert_eq!(again["flow"]["tasks"].as_array().unwrap().len(), 1);
        for outside in ["agent:mainframe", "agent:other", "agent"] {
            let (status, result) = act(&actions, &route, json!({"action": "run_task", "flowId": flow, "runtime": "acp", "task": "t", "childSessionKey": outside})).await;
            assert_eq!(
                (status, &result["code"]),
                (400, &json!("invalid_request")),
                "{outside}"
            );
        }
        act(&actions, &route, json!({"action": "run_task", "flowId": flow, "runtime": "acp", "task": "t", "status": "running"})).await;
        let (_, summary) = act(
            &actions,
            &route,
            json!({"action": "get_task_summary", "flowId": flow}),
        )
        .await;
        assert_eq!(summary["total"], 2);
        assert_eq!(summary["active"], 2);
        assert_eq!(summary["byStatus"]["running"], 1);
        assert_eq!(summary["byRuntime"]["subagent"], 1);
    }

    #[tokio::test]
    async fn cancel_flow_cancels_recorded_tasks_then_the_flow() {
        let actions = actions();
        let route = main_route();
        let flow = created(&actions, &route, "g").await;
        act(
            &actions,
            &route,
            json!({"action": "run_task", "flowId": flow, "runtime": "acp", "task": "t"}),
        )
        .await;
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "cancel_flow", "flowId": flow}),
        )
        .await;
        assert_eq!((status, &result["outcome"]), (200, &json!("cancelled")));
        assert_eq!(result["flow"]["status"], "cancelled");
        assert_eq!(result["flow"]["tasks"][0]["status"], "cancelled");
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "cancel_flow", "flowId": flow}),
        )
        .await;
        assert_eq!((status, &result["code"]), (409, &json!("terminal")));
    }

    /// Starts every task running; stops them only when the host says so.
    #[derive(Default)]
    struct SlowRunner {
        refuse: Mutex<bool>,
        cancels: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl TaskRunner for SlowRunner {
        async fn start(&self, _: &TaskLaunch) -> Result<Option<TaskStatus>, TaskRunnerError> {
            if *self.refuse.lock().unwrap() {
                return Err(TaskRunnerError("no workers".into()));
            }
            Ok(Some(FlowStatus::Running))
        }

        async fn cancel(&self, launch: &TaskLaunch) -> CancelOutcome {
            self.cancels
                .lock()
                .unwrap()
                .push(launch.task.task_id.clone());
            CancelOutcome::Pending
        }
    }

    #[tokio::test]
    async fn a_cancel_waits_for_active_tasks_and_ends_when_the_last_one_stops() {
        let runner = Arc::new(SlowRunner::default());
        let actions = actions().task_runner(runner.clone());
        let route = main_route();
        let flow = created(&actions, &route, "g").await;
        let (status, started) = act(
            &actions,
            &route,
            json!({"action": "run_task", "flowId": flow, "runtime": "acp", "task": "t"}),
        )
        .await;
        assert_eq!(
            (status, &started["task"]["status"]),
            (201, &json!("running"))
        );
        let task_id = started["task"]["taskId"].as_str().unwrap().to_owned();
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "cancel_flow", "flowId": flow}),
        )
        .await;
        assert_eq!(
            (status, &result["outcome"], &result["activeTasks"]),
            (202, &json!("cancel_pending"), &json!(1))
        );
        assert_eq!(result["flow"]["status"], "queued");
        assert_eq!(runner.cancels.lock().unwrap().len(), 1, "asked once");
        // A second cancel_flow asks the runner again about the task still active.
        let (status, _) = act(
            &actions,
            &route,
            json!({"action": "cancel_flow", "flowId": flow}),
        )
        .await;
        assert_eq!(status, 202);
        assert_eq!(runner.cancels.lock().unwrap().len(), 2);
        assert_eq!(
            actions
                .set_task_status("agent:main", &flow, &task_id, FlowStatus::Cancelled, None)
                .await
                .unwrap(),
            TaskUpdate::Updated
        );
        let (_, result) = act(
            &actions,
            &route,
            json!({"action": "get_flow", "flowId": flow}),
        )
        .await;
        assert_eq!(result["flow"]["status"], "cancelled");
        assert_eq!(
            actions
                .set_task_status("agent:main", &flow, "task-none", FlowStatus::Failed, None)
                .await
                .unwrap(),
            TaskUpdate::NoSuchTask
        );
        // An ended task keeps its ending, and the ended flow stays ended.
        assert_eq!(
            actions
                .set_task_status("agent:main", &flow, &task_id, FlowStatus::Running, None)
                .await
                .unwrap(),
            TaskUpdate::AlreadyEnded(FlowStatus::Cancelled)
        );
        let (_, result) = act(
            &actions,
            &route,
            json!({"action": "get_flow", "flowId": flow}),
        )
        .await;
        assert_eq!(result["flow"]["tasks"][0]["status"], "cancelled");

        *runner.refuse.lock().unwrap() = true;
        let other = created(&actions, &route, "h").await;
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "run_task", "flowId": other, "runtime": "acp", "task": "t"}),
        )
        .await;
        assert_eq!((status, &result["code"]), (409, &json!("task_not_created")));
        assert_eq!(result["result"]["flow"]["tasks"][0]["status"], "failed");
    }

    const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

    /// Actions on a fresh store with a hand-driven clock: flows ended keep
    /// an hour, live ones a day from their last change, three a session.
    /// Each check on MemoryStore and on SqliteStore.
    macro_rules! on_both_embedded_stores {
        ($($check:ident),*) => {$(
            mod $check {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    super::$check(std::sync::Arc::new(crate::store::MemoryStore::new())).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    let directory = tempfile::tempdir().unwrap();
                    let store = crate::store::SqliteStore::open(
                        directory.path().join("modelgate.db"),
                        crate::store::SqliteStoreConfig::default(),
                    )
                    .unwrap();
                    super::$check(std::sync::Arc::new(store)).await;
                }
            }
        )*};
    }

    on_both_embedded_stores!(
        an_ended_flow_is_kept_for_its_retention_and_a_live_one_while_it_changes,
        a_session_holds_at_most_its_cap_and_an_expired_flow_frees_its_place,
        concurrent_creates_never_pass_the_cap,
        of_two_writers_at_one_revision_exactly_one_wins
    );

    fn bounded(store: SharedStore) -> (FlowActions, crate::clock::ManualClock) {
        use chrono::TimeZone;
        let clock = crate::clock::ManualClock::new(
            chrono::Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap(),
        );
        let limits = WebhookLimits {
            ended_flow_retention: HOUR,
            idle_flow_retention: 24 * HOUR,
            max_flows_per_session: 3,
            ..WebhookLimits::default()
        };
        let actions = FlowActions::new(store)
            .clock(Arc::new(clock.clone()))
            .limits(limits);
        (actions, clock)
    }

    async fn listed(actions: &FlowActions, route: &RouteScope) -> Vec<Value> {
        let (_, listed) = act(actions, route, json!({"action": "list_flows"})).await;
        listed["flows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|flow| flow["flowId"].clone())
            .collect()
    }

    async fn an_ended_flow_is_kept_for_its_retention_and_a_live_one_while_it_changes(
        store: SharedStore,
    ) {
        let (actions, clock) = bounded(store);
        let route = main_route();
        let ended = created(&actions, &route, "ended").await;
        let live = created(&actions, &route, "live").await;
        act(
            &actions,
            &route,
            json!({"action": "finish_flow", "flowId": ended, "expectedRevision": 1}),
        )
        .await;
        clock.advance(HOUR - std::time::Duration::from_secs(1));
        let (status, _) = act(
            &actions,
            &route,
            json!({"action": "get_flow", "flowId": ended}),
        )
        .await;
        assert_eq!(status, 200, "kept for the hour after it ended");
        clock.advance(std::time::Duration::from_secs(1));
        let (status, result) = act(
            &actions,
            &route,
            json!({"action": "get_flow", "flowId": ended}),
        )
        .await;
        assert_eq!((status, &result["code"]), (404, &json!("not_found")));
        assert_eq!(listed(&actions, &route).await, [json!(live)]);
        // The live flow changes 20 h in: a day from then it is still there…
        clock.advance(19 * HOUR);
        let (status, _) = act(
            &actions,
            &route,
            json!({"action": "set_waiting", "flowId": live, "expectedRevision": 1}),
        )
        .await;
        assert_eq!(status, 200);
        clock.advance(24 * HOUR - std::time::Duration::from_secs(1));
        let (status, _) = act(
            &actions,
            &route,
            json!({"action": "get_flow", "flowId": live}),
        )
        .await;
        assert_eq!(status, 200, "every write starts its idle time again");
        // …and left alone for a whole day, it is gone.
        clock.advance(std::time::Duration::from_secs(1));
        assert!(listed(&actions, &route).await.is_empty());
        let (status, result) = act(&actions, &route, json!({"action": "find_latest_flow"})).await;
        assert_eq!((status, &result["code"]), (404, &json!("not_found")));
    }

    async fn a_session_holds_at_most_its_cap_and_an_expired_flow_frees_its_place(
        store: SharedStore,
    ) {
        let (actions, clock) = bounded(store);
        let main = main_route();
        let mut flows = Vec::new();
        for goal in ["a", "b", "c"] {
            flows.push(created(&actions, &main, goal).await);
        }
        let action = FlowAction::parse(br#"{"action": "create_flow", "goal": "d"}"#).unwrap();
        let ActionReply::Refused {
            status,
            code,
            error,
            ..
        } = actions.execute(&main, action).await
        else {
            panic!("a fourth flow was created");
        };
        assert_eq!((status.as_u16(), code), (409, "too_many_flows"));
        for words in ["3 flows", "1 hour", "1 day", "finish_flow"] {
            assert!(error.contains(words), "{words}: {error}");
        }
        // Another session has its own room; the same session through
        // another route does not.
        let other = route("other", "agent:other", "webhooks/other");
        created(&actions, &other, "elsewhere").await;
        let sibling = route("sibling", "agent:main", "webhooks/sibling");
        let (status, _) = act(
            &actions,
            &sibling,
            json!({"action": "create_flow", "goal": "d"}),
        )
        .await;
        assert_eq!(status, 409);
        // An ended flow still counts until its retention is over.
        act(
            &actions,
            &main,
            json!({"action": "fail_flow", "flowId": flows[0], "expectedRevision": 1}),
        )
        .await;
        let (status, _) = act(
            &actions,
            &main,
            json!({"action": "create_flow", "goal": "d"}),
        )
        .await;
        assert_eq!(status, 409);
        clock.advance(HOUR);
        created(&actions, &main, "d").await;
        let (status, _) = act(
            &actions,
            &main,
            json!({"action": "create_flow", "goal": "e"}),
        )
        .await;
        assert_eq!(status, 409);
    }

    async fn concurrent_creates_never_pass_the_cap(store: SharedStore) {
        let (actions, _clock) = bounded(store);
        let creates = (0..24).map(|index| {
            let actions = actions.clone();
            tokio::spawn(async move {
                act(
                    &actions,
                    &main_route(),
                    json!({"action": "create_flow", "goal": format!("g{index}")}),
                )
                .await
                .0
            })
        });
        let mut statuses = Vec::new();
        for create in creates {
            statuses.push(create.await.unwrap());
        }
        assert_eq!(statuses.iter().filter(|&&status| status == 201).count(), 3);
        assert_eq!(statuses.iter().filter(|&&status| status == 409).count(), 21);
        assert_eq!(listed(&actions, &main_route()).await.len(), 3);
    }

    #[test]
    fn retentions_are_described_in_whole_units() {
        let describe = |seconds| describe(std::time::Duration::from_secs(seconds));
        assert_eq!(describe(7 * 86_400), "7 days");
        assert_eq!(describe(86_400), "1 day");
        assert_eq!(describe(7_200), "2 hours");
        assert_eq!(describe(90), "90 seconds");
        assert_eq!(describe(120), "2 minutes");
    }

    async fn of_two_writers_at_one_revision_exactly_one_wins(store: SharedStore) {
        let actions = FlowActions::new(store);
        let route = main_route();
        let flow = created(&actions, &route, "g").await;
        let writers = (0..16).map(|index| {
            let actions = actions.clone();
            let route = route.clone();
            let flow = flow.clone();
            tokio::spawn(async move {
                act(&actions, &route, json!({"action": "set_waiting", "flowId": flow, "expectedRevision": 1, "currentStep": format!("step {index}")})).await.0
            })
        });
        let mut statuses = Vec::new();
        for writer in writers {
            statuses.push(writer.await.unwrap());
        }
        assert_eq!(statuses.iter().filter(|&&status| status == 200).count(), 1);
        assert_eq!(statuses.iter().filter(|&&status| status == 409).count(), 15);
    }
}
