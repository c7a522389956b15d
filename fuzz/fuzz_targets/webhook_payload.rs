//! The webhook request body on arbitrary bytes: never panics, and what it
//! accepts keeps its promises (a known action, text fields trimmed and
//! non-empty, revisions at least 1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::webhook::{FlowAction, ACTION_NAMES};

fuzz_target!(|body: &[u8]| {
    let Ok(action) = FlowAction::parse(body) else {
        return;
    };
    assert!(ACTION_NAMES.contains(&action.name()));
    let texts: Vec<&str> = match &action {
        FlowAction::CreateFlow(create) => vec![create.goal.as_str()],
        FlowAction::GetFlow(get)
        | FlowAction::GetTaskSummary(get)
        | FlowAction::CancelFlow(get) => {
            vec![get.flow_id.as_str()]
        }
        FlowAction::ResolveFlow(resolve) => vec![resolve.token.as_str()],
        FlowAction::RunTask(run) => vec![run.flow_id.as_str(), run.task.as_str()],
        FlowAction::SetWaiting(set) => {
            assert!(set.expected_revision.0 >= 1);
            vec![set.flow_id.as_str()]
        }
        FlowAction::FinishFlow(end) | FlowAction::FailFlow(end) => {
            assert!(end.expected_revision.0 >= 1);
            vec![end.flow_id.as_str()]
        }
        _ => Vec::new(),
    };
    for text in texts {
        assert!(!text.is_empty());
        assert_eq!(text, text.trim());
    }
});
