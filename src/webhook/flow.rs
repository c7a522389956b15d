//! Managed flows and their child tasks: the records, the statuses and the
//! moves between them, and the views a route may show.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Most child tasks one flow keeps: the flow is one record, so this bounds
/// its size (and the work of every write to it).
pub const MAX_TASKS_PER_FLOW: usize = 100;

/// Where a flow or a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowStatus {
    /// Accepted, not started.
    Queued,
    /// Being worked on.
    Running,
    /// Waiting for something outside (an answer, an event).
    Waiting,
    /// Cannot go on until a blocker is cleared.
    Blocked,
    /// Ended well.
    Succeeded,
    /// Ended badly.
    Failed,
    /// Ended by a cancellation.
    Cancelled,
    /// Its runner lost track of it.
    Lost,
}

/// A task's status takes the same values as a flow's.
pub type TaskStatus = FlowStatus;

impl FlowStatus {
    /// Every status, in the order summaries list them.
    pub const ALL: [FlowStatus; 8] = [
        FlowStatus::Queued,
        FlowStatus::Running,
        FlowStatus::Waiting,
        FlowStatus::Blocked,
        FlowStatus::Succeeded,
        FlowStatus::Failed,
        FlowStatus::Cancelled,
        FlowStatus::Lost,
    ];

    /// Its name on the wire (`queued`, `running`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            FlowStatus::Queued => "queued",
            FlowStatus::Running => "running",
            FlowStatus::Waiting => "waiting",
            FlowStatus::Blocked => "blocked",
            FlowStatus::Succeeded => "succeeded",
            FlowStatus::Failed => "failed",
            FlowStatus::Cancelled => "cancelled",
            FlowStatus::Lost => "lost",
        }
    }

    /// Whether it has ended: nothing moves it any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            FlowStatus::Succeeded | FlowStatus::Failed | FlowStatus::Cancelled | FlowStatus::Lost
        )
    }
}

/// When the flow's owner wants to hear about it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyPolicy {
    /// Only when it ends.
    #[default]
    DoneOnly,
    /// On every change of status.
    StateChanges,
    /// Never.
    Silent,
}

/// What runs a child task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskRuntime {
    /// A sub-agent of the session.
    Subagent,
    /// An agent reached over the Agent Client Protocol.
    Acp,
}

impl TaskRuntime {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskRuntime::Subagent => "subagent",
            TaskRuntime::Acp => "acp",
        }
    }
}

/// A managed flow as stored. Owner and session fields stay in the store:
/// [`Flow::view`] is what a response shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    /// Its id (`flow-…`).
    pub flow_id: String,
    /// The session that owns it.
    pub owner_key: String,
    /// The route that created it.
    pub requester_origin: String,
    /// The controller that manages it: only a route with this controller id
    /// may change it.
    pub controller_id: String,
    /// What it is for.
    pub goal: String,
    /// Where it stands.
    pub status: FlowStatus,
    /// When to notify the owner.
    pub notify_policy: NotifyPolicy,
    /// The step it is at, in the controller's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    /// The controller's own state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_json: Option<Value>,
    /// What it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_json: Option<Value>,
    /// The task that blocks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_task_id: Option<String>,
    /// Why it is blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_summary: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When a cancellation was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// Its child tasks, oldest first.
    #[serde(default)]
    pub tasks: Vec<Task>,
}

/// A child task of a flow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// Its id (`task-…`).
    pub task_id: String,
    /// The caller's id for retries: a second `run_task` with the same
    /// `runId` returns this task instead of creating another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// What runs it.
    pub runtime: TaskRuntime,
    /// What to do.
    pub task: String,
    /// A name for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The session it runs in (within the route's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_session_key: Option<String>,
    /// Where it stands.
    pub status: TaskStatus,
    /// Why it ended badly, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

/// Fields a response never shows: who owns a flow and which sessions asked.
const PRIVATE_FIELDS: [&str; 5] = [
    "ownerKey",
    "requesterOrigin",
    "requesterSessionKey",
    "childSessionKey",
    "sessionKey",
];

impl Flow {
    /// Whether any child task has not ended.
    pub fn has_active_tasks(&self) -> bool {
        self.tasks.iter().any(|task| !task.status.is_terminal())
    }

    /// The flow as a response shows it: its revision added, owner and
    /// session metadata removed (from the flow and from every task).
    pub fn view(&self, revision: u64) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or_else(|_| json!({}));
        if let Value::Object(fields) = &mut value {
            strip_private(fields);
            if let Some(Value::Array(tasks)) = fields.get_mut("tasks") {
                for task in tasks {
                    if let Value::Object(task_fields) = task {
                        strip_private(task_fields);
                    }
                }
            }
            fields.insert("revision".into(), Value::from(revision));
        }
        value
    }

    /// Counts of the flow's tasks by status and by runtime.
    pub fn task_summary(&self) -> Value {
        let mut by_status = Map::new();
        for status in FlowStatus::ALL {
            let count = self
                .tasks
                .iter()
                .filter(|task| task.status == status)
                .count();
            by_status.insert(status.as_str().into(), Value::from(count));
        }
        let mut by_runtime = Map::new();
        for runtime in [TaskRuntime::Subagent, TaskRuntime::Acp] {
            let count = self
                .tasks
                .iter()
                .filter(|task| task.runtime == runtime)
                .count();
            by_runtime.insert(runtime.as_str().into(), Value::from(count));
        }
        let active = self
            .tasks
            .iter()
            .filter(|task| !task.status.is_terminal())
            .count();
        json!({
            "flowId": self.flow_id,
            "total": self.tasks.len(),
            "active": active,
            "byStatus": by_status,
            "byRuntime": by_runtime,
        })
    }
}

impl Task {
    /// The task as a response shows it, without its session key.
    pub fn view(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or_else(|_| json!({}));
        if let Value::Object(fields) = &mut value {
            strip_private(fields);
        }
        value
    }
}

fn strip_private(fields: &mut Map<String, Value>) {
    for name in PRIVATE_FIELDS {
        fields.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Flow {
        let now = DateTime::UNIX_EPOCH;
        Flow {
            flow_id: "flow-1".into(),
            owner_key: "agent:main".into(),
            requester_origin: "route-deploys".into(),
            controller_id: "webhooks/deploys".into(),
            goal: "ship".into(),
            status: FlowStatus::Running,
            notify_policy: NotifyPolicy::DoneOnly,
            current_step: None,
            state_json: Some(json!({"step": 1})),
            wait_json: None,
            blocked_task_id: None,
            blocked_summary: None,
            error: None,
            cancel_requested_at: None,
            created_at: now,
            updated_at: now,
            ended_at: None,
            tasks: vec![Task {
                task_id: "task-1".into(),
                run_id: Some("run-1".into()),
                runtime: TaskRuntime::Acp,
                task: "build".into(),
                label: None,
                child_session_key: Some("agent:main:child".into()),
                status: FlowStatus::Queued,
                error: None,
                created_at: now,
                updated_at: now,
            }],
        }
    }

    #[test]
    fn a_view_never_shows_owner_or_session_metadata() {
        let view = flow().view(3);
        let text = view.to_string();
        for secret in ["agent:main", "route-deploys", "ownerKey", "childSessionKey"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert_eq!(view["revision"], 3);
        assert_eq!(view["controllerId"], "webhooks/deploys");
        assert_eq!(view["tasks"][0]["taskId"], "task-1");
        assert!(!flow().tasks[0].view().to_string().contains("agent:main"));
    }

    #[test]
    fn stored_flows_round_trip() {
        let stored = serde_json::to_vec(&flow()).unwrap();
        assert_eq!(serde_json::from_slice::<Flow>(&stored).unwrap(), flow());
    }

    #[test]
    fn summaries_count_by_status_and_runtime() {
        let mut flow = flow();
        let mut done = flow.tasks[0].clone();
        done.status = FlowStatus::Succeeded;
        done.runtime = TaskRuntime::Subagent;
        flow.tasks.push(done);
        let summary = flow.task_summary();
        assert_eq!(summary["total"], 2);
        assert_eq!(summary["active"], 1);
        assert_eq!(summary["byStatus"]["queued"], 1);
        assert_eq!(summary["byStatus"]["succeeded"], 1);
        assert_eq!(summary["byStatus"]["lost"], 0);
        assert_eq!(summary["byRuntime"]["acp"], 1);
        assert_eq!(summary["byRuntime"]["subagent"], 1);
        assert!(flow.has_active_tasks());
    }

    #[test]
    fn terminal_statuses_are_exactly_the_four_endings() {
        let terminal: Vec<_> = FlowStatus::ALL
            .into_iter()
            .filter(|status| status.is_terminal())
            .map(FlowStatus::as_str)
            .collect();
        assert_eq!(terminal, ["succeeded", "failed", "cancelled", "lost"]);
        for status in FlowStatus::ALL {
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                Value::from(status.as_str())
            );
        }
    }
}
