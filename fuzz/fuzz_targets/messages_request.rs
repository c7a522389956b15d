//! `MessagesRequest::parse` (and `parse_count_tokens`) on arbitrary bytes:
//! never panics; whatever it accepts satisfies the documented bounds (the
//! roles' blocks, the thinking budget under `max_tokens`, every web search
//! bounded by `max_uses`) and its prompt size counts at least its text's
//! bytes; whatever it refuses is a 400 or 422, naming a field unless the
//! body as a whole is wrong; the count variant differs only on
//! `max_tokens` and `stream`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::{
    BlockKind, ContentBlock, MessagesContent, MessagesRequest, MessagesRole, SystemPrompt,
    ToolKind,
};
use serde_json::Value;

/// Bytes of plain text the prompt size must count at least: string
/// contents and text blocks, at every depth.
fn text_bytes(content: &MessagesContent) -> u64 {
    match content {
        MessagesContent::Text(text) => text.len() as u64,
        MessagesContent::Blocks(blocks) => blocks.iter().map(block_text_bytes).sum(),
    }
}

fn block_text_bytes(block: &ContentBlock) -> u64 {
    match &block.kind {
        BlockKind::Text { text } => text.len() as u64,
        BlockKind::ToolResult {
            content: Some(content),
            ..
        } => text_bytes(content),
        _ => 0,
    }
}

fn check_blocks(role: MessagesRole, content: &MessagesContent) {
    let MessagesContent::Blocks(blocks) = content else {
        return;
    };
    for block in blocks {
        match (&block.kind, role) {
            (
                BlockKind::ToolUse { .. }
                | BlockKind::Thinking { .. }
                | BlockKind::RedactedThinking { .. },
                MessagesRole::User,
            ) => panic!("an assistant-only block in a user message"),
            (BlockKind::ToolResult { .. }, MessagesRole::Assistant) => {
                panic!("a tool result in an assistant message")
            }
            _ => {}
        }
    }
}

fuzz_target!(|body: &[u8]| {
    let parsed = MessagesRequest::parse(body);
    let counted = MessagesRequest::parse_count_tokens(body);
    let value: Option<Value> = serde_json::from_slice(body).ok();
    let has = |name: &str| {
        value
            .as_ref()
            .and_then(Value::as_object)
            .is_some_and(|fields| fields.contains_key(name))
    };
    match &parsed {
        Ok(request) => {
            let value = value.as_ref().expect("accepted means JSON");
            assert_eq!(request.model_id.as_str(), request.model);
            assert!(!request.messages.is_empty());
            assert!(request.temperature.is_none_or(|t| (0.0..=1.0).contains(&t)));
            assert!(request.top_p.is_none_or(|p| (0.0..=1.0).contains(&p)));
            assert_eq!(request.max_tokens, value["max_tokens"].as_u64());
            assert!(request.max_tokens.is_none_or(|m| m >= 1));
            if let Some(budget) = request.thinking_budget_tokens() {
                assert!(budget >= 1024);
                assert!(request.max_tokens.is_none_or(|max| budget < max));
            }
            // Every web search tool sent is bounded.
            let searches = value["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|tool| {
                    tool["type"]
                        .as_str()
                        .is_some_and(|kind| kind.starts_with("web_search_"))
                })
                .map(|tool| tool["max_uses"].as_u64().expect("bounded"))
                .fold(None, |sum: Option<u64>, uses| {
                    Some(sum.unwrap_or(0).saturating_add(uses))
                });
            assert_eq!(request.web_search_max_uses(), searches);
            for tool in request.tools.iter().flatten() {
                if let ToolKind::WebSearch { max_uses, .. } = tool.kind {
                    assert!(max_uses >= 1);
                }
            }
            let mut text = match &request.system {
                Some(SystemPrompt::Text(text)) => text.len() as u64,
                Some(SystemPrompt::Blocks(blocks)) => blocks.iter().map(block_text_bytes).sum(),
                None => 0,
            };
            for message in &request.messages {
                check_blocks(message.role, &message.content);
                text += text_bytes(&message.content);
            }
            let size = request.prompt_size();
            assert!(size.measured_bytes >= text);
            assert_eq!(size.message_count, request.messages.len() as u64);
            let _ = request.longest_cache_ttl();
        }
        Err(error) => {
            assert!(matches!(error.status().as_u16(), 400 | 422));
            // Only a body wrong as a whole names no field.
            if !error.message().starts_with("the request body") {
                assert!(error.metadata()["param"].is_string(), "{}", error.message());
            }
        }
    }
    match &counted {
        Ok(request) => assert!(!has("max_tokens") && !has("stream") && request.max_tokens.is_none()),
        Err(error) => assert!(matches!(error.status().as_u16(), 400 | 422)),
    }
    // Without the two fields, the endpoints read a body alike.
    if !has("max_tokens") && !has("stream") {
        match (&parsed, &counted) {
            (Ok(_), Ok(_)) => {}
            (Err(a), Err(b)) => assert_eq!(a.message(), b.message()),
            _ => panic!("the endpoints disagree on a body without max_tokens and stream"),
        }
    }
});
