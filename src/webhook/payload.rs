//! The webhook request body: `{"action": "<one of 13>", …action fields}`,
//! read strictly. Unknown fields are refused, strings are trimmed and must
//! not be empty, and every error names the field it is about.

use std::fmt;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::flow::{FlowStatus, NotifyPolicy, TaskRuntime};
use crate::json_input::{JsonBodyError, top_level_fields};

/// Longest identifier accepted (`flowId`, `runId`, `childSessionKey`, …), in characters.
pub const MAX_ID_CHARS: usize = 256;
/// Longest free text accepted (`goal`, `task`, a summary), in characters.
pub const MAX_TEXT_CHARS: usize = 8192;
/// Most flows one `list_flows` returns.
pub const MAX_LIST_LIMIT: usize = 100;
/// Flows `list_flows` returns when it names no `limit`.
pub const DEFAULT_LIST_LIMIT: usize = 20;

/// One parsed webhook request.
#[derive(Clone, Debug, PartialEq)]
pub enum FlowAction {
    /// `create_flow`.
    CreateFlow(CreateFlow),
    /// `get_flow`.
    GetFlow(FlowRef),
    /// `list_flows`.
    ListFlows(ListFlows),
    /// `find_latest_flow`.
    FindLatestFlow(FindLatestFlow),
    /// `resolve_flow`.
    ResolveFlow(ResolveFlow),
    /// `get_task_summary`.
    GetTaskSummary(FlowRef),
    /// `set_waiting`.
    SetWaiting(SetWaiting),
    /// `resume_flow`.
    ResumeFlow(ResumeFlow),
    /// `finish_flow`.
    FinishFlow(EndFlow),
    /// `fail_flow`.
    FailFlow(EndFlow),
    /// `request_cancel`.
    RequestCancel(RevisedFlowRef),
    /// `cancel_flow`.
    CancelFlow(FlowRef),
    /// `run_task`.
    RunTask(RunTask),
}

/// The 13 action names, as the wire spells them.
pub const ACTION_NAMES: [&str; 13] = [
    "create_flow",
    "get_flow",
    "list_flows",
    "find_latest_flow",
    "resolve_flow",
    "get_task_summary",
    "set_waiting",
    "resume_flow",
    "finish_flow",
    "fail_flow",
    "request_cancel",
    "cancel_flow",
    "run_task",
];

/// `create_flow`: a new flow for the route's session.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateFlow {
    /// What the flow is for.
    pub goal: Text<MAX_TEXT_CHARS>,
    /// Its first status: queued (the default), running, waiting or blocked.
    pub status: Option<FlowStatus>,
    /// When to notify: done_only (the default), state_changes or silent.
    pub notify_policy: Option<NotifyPolicy>,
    /// The step it starts at.
    pub current_step: Option<Text<MAX_TEXT_CHARS>>,
    /// The controller's state.
    pub state_json: Option<Value>,
    /// What it waits for.
    pub wait_json: Option<Value>,
}

/// An action on one flow: `get_flow`, `get_task_summary`, `cancel_flow`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FlowRef {
    /// The flow.
    pub flow_id: Text<MAX_ID_CHARS>,
}

/// `request_cancel`: a flow at a known revision.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevisedFlowRef {
    /// The flow.
    pub flow_id: Text<MAX_ID_CHARS>,
    /// The revision the caller last saw; another one is a conflict.
    pub expected_revision: Revision,
}

/// `list_flows`: the session's flows, newest first.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListFlows {
    /// How many, from 1 to 100 (default 20).
    pub limit: Option<usize>,
    /// Only flows with this status, among the session's 1000 newest.
    pub status: Option<FlowStatus>,
}

/// `find_latest_flow`: the session's newest flow.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FindLatestFlow {
    /// Only a flow with this status, among the session's 1000 newest.
    pub status: Option<FlowStatus>,
}

/// `resolve_flow`: a flow id, or the route's session key for its latest flow.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResolveFlow {
    /// A flow id or the route's session key.
    pub token: Text<MAX_ID_CHARS>,
}

/// `set_waiting`: the flow waits (or is blocked, when a blocker is named).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetWaiting {
    /// The flow.
    pub flow_id: Text<MAX_ID_CHARS>,
    /// The revision the caller last saw.
    pub expected_revision: Revision,
    /// The step it waits at.
    pub current_step: Option<Text<MAX_TEXT_CHARS>>,
    /// The controller's state.
    pub state_json: Option<Value>,
    /// What it waits for.
    pub wait_json: Option<Value>,
    /// A task of the flow that blocks it.
    pub blocked_task_id: Option<Text<MAX_ID_CHARS>>,
    /// Why it is blocked.
    pub blocked_summary: Option<Text<MAX_TEXT_CHARS>>,
}

/// `resume_flow`: back to queued or running.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResumeFlow {
    /// The flow.
    pub flow_id: Text<MAX_ID_CHARS>,
    /// The revision the caller last saw.
    pub expected_revision: Revision,
    /// queued or running (the default).
    pub status: Option<FlowStatus>,
    /// The step it resumes at.
    pub current_step: Option<Text<MAX_TEXT_CHARS>>,
    /// The controller's state.
    pub state_json: Option<Value>,
}

/// `finish_flow` and `fail_flow`: the flow ends.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndFlow {
    /// The flow.
    pub flow_id: Text<MAX_ID_CHARS>,
    /// The revision the caller last saw.
    pub expected_revision: Revision,
    /// The controller's final state.
    pub state_json: Option<Value>,
    /// Why it failed (`fail_flow` only).
    pub error: Option<Text<MAX_TEXT_CHARS>>,
}

/// `run_task`: a child task in an existing flow.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunTask {
    /// The flow.
    pub flow_id: Text<MAX_ID_CHARS>,
    /// subagent or acp.
    pub runtime: TaskRuntime,
    /// What to do.
    pub task: Text<MAX_TEXT_CHARS>,
    /// The session it runs in: the route's session or one under it.
    pub child_session_key: Option<Text<MAX_ID_CHARS>>,
    /// The caller's id for retries: the same `runId` gives the same task.
    pub run_id: Option<Text<MAX_ID_CHARS>>,
    /// A name for people.
    pub label: Option<Text<MAX_ID_CHARS>>,
    /// Its first status: queued (the default) or running.
    pub status: Option<FlowStatus>,
}

/// A string that was trimmed, is not empty and has at most `MAX_CHARS`
/// characters (and no control characters other than line breaks and tabs).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Text<const MAX_CHARS: usize>(String);

impl<const MAX_CHARS: usize> Text<MAX_CHARS> {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl<const MAX_CHARS: usize> fmt::Debug for Text<MAX_CHARS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<'de, const MAX_CHARS: usize> Deserialize<'de> for Text<MAX_CHARS> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let text = String::deserialize(deserializer)?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(D::Error::custom("must not be empty or only whitespace"));
        }
        if trimmed.chars().count() > MAX_CHARS {
            return Err(D::Error::custom(format_args!(
                "must be at most {MAX_CHARS} characters"
            )));
        }
        if trimmed
            .chars()
            .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        {
            return Err(D::Error::custom("must not contain control characters"));
        }
        Ok(Text(trimmed.to_owned()))
    }
}

/// A flow revision: at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Revision(pub u64);

impl<'de> Deserialize<'de> for Revision {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match u64::deserialize(deserializer)? {
            0 => Err(D::Error::custom(
                "must be at least 1: revisions start at 1 when a flow is created",
            )),
            revision => Ok(Revision(revision)),
        }
    }
}

/// A body the webhook refuses: 400 `invalid_request`, naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadError {
    field: Option<String>,
    message: String,
}

impl PayloadError {
    fn new(field: Option<&str>, message: impl Into<String>) -> Self {
        PayloadError {
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }

    /// The field at fault, when one is (`goal`, `expectedRevision`, …).
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "`{field}` {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PayloadError {}

impl FlowAction {
    /// Reads a webhook body.
    ///
    /// ```
    /// use modelgate::webhook::FlowAction;
    ///
    /// let action = FlowAction::parse(br#"{"action": "create_flow", "goal": "  Ship the release  "}"#).unwrap();
    /// let FlowAction::CreateFlow(create) = action else { unreachable!() };
    /// assert_eq!(create.goal.as_str(), "Ship the release");
    ///
    /// let error = FlowAction::parse(br#"{"action": "get_flow", "flowId": "f", "extra": 1}"#).unwrap_err();
    /// assert_eq!(error.field(), Some("extra"));
    /// ```
    pub fn parse(body: &[u8]) -> Result<FlowAction, PayloadError> {
        let mut fields = top_level_fields(body).map_err(|error| match error {
            JsonBodyError::NotJson(reason) => {
                PayloadError::new(None, format!("the body is not valid JSON: {reason}"))
            }
            JsonBodyError::NotObject(found) => PayloadError::new(
                None,
                format!("the body must be a JSON object with an `action`, not {found}"),
            ),
            JsonBodyError::Duplicate(key) => {
                PayloadError::new(Some(&key), "appears twice: each field may appear once")
            }
        })?;
        let action = match fields.remove("action") {
            None | Some(Value::Null) => {
                return Err(PayloadError::new(
                    Some("action"),
                    format!("is required: one of {}", ACTION_NAMES.join(", ")),
                ));
            }
            Some(Value::String(action)) => action,
            Some(_) => {
                return Err(PayloadError::new(
                    Some("action"),
                    format!("must be a string: one of {}", ACTION_NAMES.join(", ")),
                ));
            }
        };
        let parsed = match action.trim() {
            "create_flow" => FlowAction::CreateFlow(fields_as(fields)?),
            "get_flow" => FlowAction::GetFlow(fields_as(fields)?),
            "list_flows" => FlowAction::ListFlows(fields_as(fields)?),
            "find_latest_flow" => FlowAction::FindLatestFlow(fields_as(fields)?),
            "resolve_flow" => FlowAction::ResolveFlow(fields_as(fields)?),
            "get_task_summary" => FlowAction::GetTaskSummary(fields_as(fields)?),
            "set_waiting" => FlowAction::SetWaiting(fields_as(fields)?),
            "resume_flow" => FlowAction::ResumeFlow(fields_as(fields)?),
            "finish_flow" => FlowAction::FinishFlow(fields_as(fields)?),
            "fail_flow" => FlowAction::FailFlow(fields_as(fields)?),
            "request_cancel" => FlowAction::RequestCancel(fields_as(fields)?),
            "cancel_flow" => FlowAction::CancelFlow(fields_as(fields)?),
            "run_task" => FlowAction::RunTask(fields_as(fields)?),
            other => {
                return Err(PayloadError::new(
                    Some("action"),
                    format!(
                        "{:?} is not an action: use one of {}",
                        truncated(other),
                        ACTION_NAMES.join(", ")
                    ),
                ));
            }
        };
        parsed.validate()?;
        Ok(parsed)
    }

    /// The action's name on the wire.
    pub fn name(&self) -> &'static str {
        let index = match self {
            FlowAction::CreateFlow(_) => 0,
            FlowAction::GetFlow(_) => 1,
            FlowAction::ListFlows(_) => 2,
            FlowAction::FindLatestFlow(_) => 3,
            FlowAction::ResolveFlow(_) => 4,
            FlowAction::GetTaskSummary(_) => 5,
            FlowAction::SetWaiting(_) => 6,
            FlowAction::ResumeFlow(_) => 7,
            FlowAction::FinishFlow(_) => 8,
            FlowAction::FailFlow(_) => 9,
            FlowAction::RequestCancel(_) => 10,
            FlowAction::CancelFlow(_) => 11,
            FlowAction::RunTask(_) => 12,
        };
        ACTION_NAMES[index]
    }

    /// Checks what the types alone cannot: which statuses each action
    /// allows, and ranges.
    fn validate(&self) -> Result<(), PayloadError> {
        use FlowStatus::*;
        let allowed: (&Option<FlowStatus>, &[FlowStatus]) = match self {
            FlowAction::CreateFlow(create) => {
                (&create.status, &[Queued, Running, Waiting, Blocked])
            }
            FlowAction::ResumeFlow(resume) => (&resume.status, &[Queued, Running]),
            FlowAction::RunTask(run) => (&run.status, &[Queued, Running]),
            FlowAction::ListFlows(list) => {
                if let Some(limit) = list.limit
                    && !(1..=MAX_LIST_LIMIT).contains(&limit)
                {
                    return Err(PayloadError::new(
                        Some("limit"),
                        format!("must be from 1 to {MAX_LIST_LIMIT}"),
                    ));
                }
                return Ok(());
            }
            FlowAction::FinishFlow(end) if end.error.is_some() => {
                return Err(PayloadError::new(
                    Some("error"),
                    "is for fail_flow: a finished flow succeeded",
                ));
            }
            _ => return Ok(()),
        };
        match allowed {
            (Some(status), permitted) if !permitted.contains(status) => Err(PayloadError::new(
                Some("status"),
                format!(
                    "must be one of {} for {}, not {}",
                    permitted
                        .iter()
                        .map(|status| status.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.name(),
                    status.as_str()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The action's fields (without `action`) as its payload type, naming the
/// field of any error.
fn fields_as<T: serde::de::DeserializeOwned>(
    fields: Map<String, Value>,
) -> Result<T, PayloadError> {
    serde_path_to_error::deserialize(Value::Object(fields)).map_err(|error| {
        let path = error.path().to_string();
        let message = error.inner().to_string();
        // serde reports a missing or unknown field at the object's level,
        // naming it in the message: take the name from there.
        let named = message.split('`').nth(1).filter(|_| {
            message.starts_with("missing field") || message.starts_with("unknown field")
        });
        let field = match (path.as_str(), named) {
            (_, Some(name)) => name.to_owned(),
            (".", None) => return PayloadError::new(None, message),
            (path, None) => path.to_owned(),
        };
        let message = match message.split_once(", expected one of") {
            Some((unknown, expected)) if message.starts_with("unknown field") => {
                format!("is not a field of this action ({unknown}); expected one of{expected}")
            }
            _ if message.starts_with("missing field") => "is required".to_owned(),
            _ => message,
        };
        PayloadError::new(Some(&field), message)
    })
}

fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<FlowAction, PayloadError> {
        FlowAction::parse(value.to_string().as_bytes())
    }

    fn refused(value: Value) -> (Option<String>, String) {
        let error = parse(value).unwrap_err();
        (error.field().map(str::to_owned), error.to_string())
    }

    fn minimal_payloads() -> [Value; 13] {
        [
            json!({"action": "create_flow", "goal": "g"}),
            json!({"action": "get_flow", "flowId": "f"}),
            json!({"action": "list_flows"}),
            json!({"action": "find_latest_flow"}),
            json!({"action": "resolve_flow", "token": "t"}),
            json!({"action": "get_task_summary", "flowId": "f"}),
            json!({"action": "set_waiting", "flowId": "f", "expectedRevision": 1}),
            json!({"action": "resume_flow", "flowId": "f", "expectedRevision": 1}),
            json!({"action": "finish_flow", "flowId": "f", "expectedRevision": 1}),
            json!({"action": "fail_flow", "flowId": "f", "expectedRevision": 1}),
            json!({"action": "request_cancel", "flowId": "f", "expectedRevision": 1}),
            json!({"action": "cancel_flow", "flowId": "f"}),
            json!({"action": "run_task", "flowId": "f", "runtime": "acp", "task": "t"}),
        ]
    }

    #[test]
    fn every_action_parses_with_its_required_fields() {
        for (value, name) in minimal_payloads().into_iter().zip(ACTION_NAMES) {
            let action = parse(value.clone()).unwrap_or_else(|error| panic!("{value}: {error}"));
            assert_eq!(action.name(), name);
        }
    }

    #[test]
    fn the_full_create_flow_payload_is_read() {
        let action = parse(json!({
            "action": "create_flow", "goal": " g ", "status": "running", "notifyPolicy": "state_changes",
            "currentStep": "build", "stateJson": {"a": [1]}, "waitJson": "x"
        }))
        .unwrap();
        assert_eq!(
            action,
            FlowAction::CreateFlow(CreateFlow {
                goal: Text("g".into()),
                status: Some(FlowStatus::Running),
                notify_policy: Some(NotifyPolicy::StateChanges),
                current_step: Some(Text("build".into())),
                state_json: Some(json!({"a": [1]})),
                wait_json: Some(json!("x")),
            })
        );
    }

    #[test]
    fn each_kind_of_bad_field_is_named() {
        let cases = [
            (json!({"action": "create_flow"}), "goal", "is required"),
            (
                json!({"action": "create_flow", "goal": "   "}),
                "goal",
                "must not be empty",
            ),
            (
                json!({"action": "create_flow", "goal": 3}),
                "goal",
                "invalid type",
            ),
            (
                json!({"action": "create_flow", "goal": "g", "gaol": 1}),
                "gaol",
                "is not a field",
            ),
            (
                json!({"action": "create_flow", "goal": "g", "status": "succeeded"}),
                "status",
                "must be one of queued",
            ),
            (
                json!({"action": "create_flow", "goal": "g", "status": "paused"}),
                "status",
                "unknown variant",
            ),
            (
                json!({"action": "create_flow", "goal": "g", "notifyPolicy": "loud"}),
                "notifyPolicy",
                "unknown variant",
            ),
            (
                json!({"action": "set_waiting", "flowId": "f"}),
                "expectedRevision",
                "is required",
            ),
            (
                json!({"action": "set_waiting", "flowId": "f", "expectedRevision": 0}),
                "expectedRevision",
                "at least 1",
            ),
            (
                json!({"action": "set_waiting", "flowId": "f", "expectedRevision": -1}),
                "expectedRevision",
                "invalid value",
            ),
            (
                json!({"action": "set_waiting", "flowId": "f", "expectedRevision": "1"}),
                "expectedRevision",
                "invalid type",
            ),
            (
                json!({"action": "resume_flow", "flowId": "f", "expectedRevision": 1, "status": "waiting"}),
                "status",
                "queued, running",
            ),
            (
                json!({"action": "run_task", "flowId": "f", "runtime": "shell", "task": "t"}),
                "runtime",
                "unknown variant",
            ),
            (
                json!({"action": "run_task", "flowId": "f", "runtime": "acp"}),
                "task",
                "is required",
            ),
            (
                json!({"action": "list_flows", "limit": 0}),
                "limit",
                "from 1 to 100",
            ),
            (
                json!({"action": "list_flows", "limit": 101}),
                "limit",
                "from 1 to 100",
            ),
            (
                json!({"action": "finish_flow", "flowId": "f", "expectedRevision": 1, "error": "x"}),
                "error",
                "fail_flow",
            ),
            (
                json!({"action": "get_flow", "flowId": "a\u{0}b"}),
                "flowId",
                "control characters",
            ),
            (
                json!({"action": "get_flow", "flowId": "x".repeat(257)}),
                "flowId",
                "at most 256",
            ),
            (json!({"action": "explode"}), "action", "is not an action"),
            (json!({"action": 7}), "action", "must be a string"),
            (json!({"goal": "g"}), "action", "is required"),
            (json!({"action": null}), "action", "is required"),
        ];
        for (value, field, fragment) in cases {
            let (named, message) = refused(value.clone());
            assert_eq!(named.as_deref(), Some(field), "{value}: {message}");
            assert!(message.contains(fragment), "{value}: {message}");
        }
    }

    #[test]
    fn bodies_that_are_not_one_json_object_are_refused() {
        for (body, fragment) in [
            (&b"not json"[..], "not valid JSON"),
            (b"{\"action\": \"get_flow\",", "not valid JSON"),
            (b"[1]", "not an array"),
            (b"\"create_flow\"", "not a string"),
            (b"", "not valid JSON"),
        ] {
            let error = FlowAction::parse(body).unwrap_err();
            assert_eq!(error.field(), None);
            assert!(error.to_string().contains(fragment), "{error}");
        }
        let error = FlowAction::parse(br#"{"action": "get_flow", "flowId": "a", "flowId": "b"}"#)
            .unwrap_err();
        assert_eq!(error.field(), Some("flowId"));
        let error =
            FlowAction::parse(br#"{"action": "get_flow", "action": "cancel_flow", "flowId": "a"}"#)
                .unwrap_err();
        assert_eq!(error.field(), Some("action"));
    }

    proptest! {
        #[test]
        fn no_input_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = FlowAction::parse(&body);
        }

        #[test]
        fn text_fields_come_out_trimmed_and_non_empty(goal in "\\PC{0,40}") {
            match parse(json!({"action": "create_flow", "goal": goal})) {
                Ok(FlowAction::CreateFlow(create)) => {
                    prop_assert_eq!(create.goal.as_str(), goal.trim());
                    prop_assert!(!create.goal.as_str().is_empty());
                }
                Ok(other) => prop_assert!(false, "{:?}", other),
                Err(error) => {
                    prop_assert_eq!(error.field(), Some("goal"));
                    prop_assert!(goal.trim().is_empty() || goal.trim().chars().any(char::is_control));
                }
            }
        }

        #[test]
        fn any_unknown_field_is_refused_by_name(index in 0usize..13, name in "[a-z]{1,12}") {
            let known = ["action", "goal", "status", "token", "limit", "runtime", "task", "label", "error"];
            prop_assume!(!known.contains(&name.as_str()));
            let mut value = minimal_payloads()[index].clone();
            value[name.as_str()] = json!(1);
            let error = parse(value).unwrap_err();
            prop_assert_eq!(error.field(), Some(name.as_str()));
        }
    }
}
