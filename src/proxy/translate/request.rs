//! Request bodies: a Messages request as chat completions, and a chat
//! request as Messages. Each side is read with the gateway's own parser, so
//! what reaches here was already checked; what the other API cannot say is
//! a 400 naming the field.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::context::{
    BlockKind, ChatMessage, ChatRequest, ContentBlock, MediaSource, MessageContent,
    MessagesContent, MessagesRequest, MessagesRole, Role, SystemPrompt, ToolChoiceKind, ToolKind,
};
use crate::error::GatewayError;
use crate::json_input::bad_request;

/// Image media types the Messages API takes.
const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// A Messages request (`POST /v1/messages`) as a chat-completions body.
///
/// The system prompt becomes a system message first; text, images (a
/// `data:` URL for base64) and PDFs (a `file` part) become content parts;
/// an assistant's `tool_use` blocks its `tool_calls`; a user's
/// `tool_result` blocks `tool` messages before the rest of that message;
/// thinking and `cache_control` are dropped. A stream asks for its usage
/// (`stream_options.include_usage`), which the gateway charges from.
/// 400 for what chat cannot say: server tools (`web_search_…` and other
/// typed tools), `mcp_servers`, files by id, URL documents, images in a
/// tool result, and block types chat has no part for.
pub(crate) fn messages_request_to_chat(body: &[u8]) -> Result<Bytes, GatewayError> {
    let request = MessagesRequest::parse(body)?;
    if request.extra.contains_key("mcp_servers") {
        return Err(bad_request(
            "mcp_servers",
            "`mcp_servers` cannot be sent to this model: its provider serves chat completions, which has no MCP connector; call the tools yourself or choose a model served through the Messages API",
        ));
    }
    let mut messages = Vec::new();
    match &request.system {
        Some(SystemPrompt::Text(text)) => {
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(SystemPrompt::Blocks(blocks)) => {
            let texts: Vec<&str> = blocks
                .iter()
                .filter_map(|block| match &block.kind {
                    BlockKind::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            if !texts.is_empty() {
                messages.push(json!({"role": "system", "content": texts.join("\n\n")}));
            }
        }
        None => {}
    }
    for (index, message) in request.messages.iter().enumerate() {
        let at = format!("messages[{index}].content");
        match message.role {
            MessagesRole::User => user_to_chat(&at, &message.content, &mut messages)?,
            MessagesRole::Assistant => messages.push(assistant_to_chat(&at, &message.content)?),
            // Text only (the parser holds it so): a system message in place.
            MessagesRole::System => {
                let text = match &message.content {
                    MessagesContent::Text(text) => text.clone(),
                    MessagesContent::Blocks(blocks) => tool_result_text(&at, blocks)?,
                };
                messages.push(json!({"role": "system", "content": text}));
            }
        }
    }
    let mut chat = chat_base(
        &request.model,
        messages,
        request.max_tokens,
        request.stream,
        request.temperature,
        request.top_p,
    );
    if let Some(stops) = request.stop_sequences.as_ref().filter(|s| !s.is_empty()) {
        chat.insert("stop".into(), json!(stops));
    }
    if let Some(Value::String(user)) = request.metadata.as_ref().and_then(|m| m.get("user_id")) {
        chat.insert("user".into(), Value::String(user.clone()));
    }
    let mut tools = Vec::new();
    for (index, tool) in request.tools.iter().flatten().enumerate() {
        match &tool.kind {
            ToolKind::Custom {
                name,
                description,
                input_schema,
            } => {
                let mut function = Map::new();
                function.insert("name".into(), Value::String(name.clone()));
                if let Some(description) = description {
                    function.insert("description".into(), Value::String(description.clone()));
                }
                function.insert("parameters".into(), Value::Object(input_schema.clone()));
                tools.push(json!({"type": "function", "function": function}));
            }
            ToolKind::WebSearch { tool_type, .. } | ToolKind::Other { tool_type } => {
                let param = format!("tools[{index}].type");
                return Err(bad_request(
                    &param,
                    format!(
                        "`{param}` is {tool_type:?}, a tool Anthropic's servers run, which this model's provider cannot: it serves chat completions, which take function tools only; send tools with `name` and `input_schema`, or choose a model served through the Messages API"
                    ),
                ));
            }
        }
    }
    // Chat refuses `tool_choice` and `parallel_tool_calls` without tools.
    if !tools.is_empty() {
        if let Some(choice) = &request.tool_choice {
            let choice_value = match choice.kind {
                ToolChoiceKind::Auto => json!("auto"),
                ToolChoiceKind::Any => json!("required"),
                ToolChoiceKind::None => json!("none"),
                ToolChoiceKind::Tool => json!({
                    "type": "function",
                    "function": {"name": choice.name.clone().unwrap_or_default()},
                }),
            };
            chat.insert("tool_choice".into(), choice_value);
            if choice.disable_parallel_tool_use == Some(true) {
                chat.insert("parallel_tool_calls".into(), Value::Bool(false));
            }
        }
        chat.insert("tools".into(), Value::Array(tools));
    }
    Ok(Bytes::from(Value::Object(chat).to_string()))
}

/// A user message: its tool results as `tool` messages first, then the
/// rest as one user message (none when nothing is left).
fn user_to_chat(
    at: &str,
    content: &MessagesContent,
    messages: &mut Vec<Value>,
) -> Result<(), GatewayError> {
    let blocks = match content {
        MessagesContent::Text(text) => {
            messages.push(json!({"role": "user", "content": text}));
            return Ok(());
        }
        MessagesContent::Blocks(blocks) => blocks,
    };
    let mut parts = Vec::new();
    let mut had_results = false;
    for (index, block) in blocks.iter().enumerate() {
        let at = format!("{at}[{index}]");
        if let BlockKind::ToolResult {
            tool_use_id,
            content,
            ..
        } = &block.kind
        {
            had_results = true;
            let text = match content {
                None => String::new(),
                Some(MessagesContent::Text(text)) => text.clone(),
                Some(MessagesContent::Blocks(inner)) => {
                    tool_result_text(&format!("{at}.content"), inner)?
                }
            };
            messages.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": text}));
        } else {
            block_to_parts(&at, block, &mut parts)?;
        }
    }
    if parts.is_empty() && had_results {
        return Ok(());
    }
    messages.push(json!({"role": "user", "content": user_content(parts)}));
    Ok(())
}

/// One text part is sent as a string, which every chat server reads.
fn user_content(mut parts: Vec<Value>) -> Value {
    if parts.len() == 1 && parts[0]["type"] == "text" {
        return parts.swap_remove(0)["text"].take();
    }
    if parts.is_empty() {
        return Value::String(String::new());
    }
    Value::Array(parts)
}

/// A tool result's blocks as the text a `tool` message holds.
fn tool_result_text(at: &str, blocks: &[ContentBlock]) -> Result<String, GatewayError> {
    let mut texts = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        match &block.kind {
            BlockKind::Text { text } => texts.push(text.as_str()),
            BlockKind::Document {
                source: MediaSource::Text { data, .. },
            } => texts.push(data.as_str()),
            _ => {
                let param = format!("{at}[{index}].type");
                return Err(bad_request(
                    &param,
                    format!(
                        "`{param}` is {:?}: this model's provider serves chat completions, whose tool results hold text only; send the tool's answer as text blocks",
                        block_type(block)
                    ),
                ));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// A user block (not a tool result) as chat content parts.
fn block_to_parts(
    at: &str,
    block: &ContentBlock,
    parts: &mut Vec<Value>,
) -> Result<(), GatewayError> {
    match &block.kind {
        BlockKind::Text { text } => parts.push(json!({"type": "text", "text": text})),
        BlockKind::Image { source } => match source {
            MediaSource::Base64 { media_type, data } => parts.push(json!({
                "type": "image_url",
                "image_url": {"url": format!("data:{media_type};base64,{data}")},
            })),
            MediaSource::Url { url } => {
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            _ => return Err(unexpressible_source(at)),
        },
        BlockKind::Document { source } => match source {
            MediaSource::Base64 { media_type, data } => {
                let filename = block
                    .extra
                    .get("title")
                    .and_then(Value::as_str)
                    .unwrap_or("document.pdf");
                parts.push(json!({
                    "type": "file",
                    "file": {"filename": filename, "file_data": format!("data:{media_type};base64,{data}")},
                }));
            }
            MediaSource::Text { data, .. } => parts.push(json!({"type": "text", "text": data})),
            MediaSource::Content { content } => match content {
                MessagesContent::Text(text) => parts.push(json!({"type": "text", "text": text})),
                MessagesContent::Blocks(inner) => {
                    for (index, inner_block) in inner.iter().enumerate() {
                        block_to_parts(
                            &format!("{at}.source.content[{index}]"),
                            inner_block,
                            parts,
                        )?;
                    }
                }
            },
            MediaSource::Url { .. } | MediaSource::File { .. } => {
                return Err(unexpressible_source(at));
            }
        },
        _ => return Err(unexpressible_block(at, block)),
    }
    Ok(())
}

fn unexpressible_source(at: &str) -> GatewayError {
    let param = format!("{at}.source.type");
    bad_request(
        &param,
        format!(
            "`{param}` cannot be sent to this model: its provider serves chat completions, which take images as base64 or URLs and documents as base64 PDFs or text; send the content inline"
        ),
    )
}

fn unexpressible_block(at: &str, block: &ContentBlock) -> GatewayError {
    let param = format!("{at}.type");
    bad_request(
        &param,
        format!(
            "`{param}` is {:?}, which this model's provider cannot take: it serves chat completions, which have no such part; choose a model served through the Messages API",
            block_type(block)
        ),
    )
}

fn block_type(block: &ContentBlock) -> &str {
    match &block.kind {
        BlockKind::Text { .. } => "text",
        BlockKind::Image { .. } => "image",
        BlockKind::Document { .. } => "document",
        BlockKind::ToolUse { .. } => "tool_use",
        BlockKind::ToolResult { .. } => "tool_result",
        BlockKind::Thinking { .. } => "thinking",
        BlockKind::RedactedThinking { .. } => "redacted_thinking",
        BlockKind::Other { kind } => kind,
    }
}

/// An assistant message: its text as content, its `tool_use` blocks as
/// `tool_calls`; thinking is dropped (chat cannot send it back).
fn assistant_to_chat(at: &str, content: &MessagesContent) -> Result<Value, GatewayError> {
    let blocks = match content {
        MessagesContent::Text(text) => return Ok(json!({"role": "assistant", "content": text})),
        MessagesContent::Blocks(blocks) => blocks,
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        match &block.kind {
            BlockKind::Text { text: part } => text.push_str(part),
            BlockKind::ToolUse { id, name, input } => calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": Value::Object(input.clone()).to_string()},
            })),
            BlockKind::Thinking { .. } | BlockKind::RedactedThinking { .. } => {}
            _ => return Err(unexpressible_block(&format!("{at}[{index}]"), block)),
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    if calls.is_empty() {
        message.insert("content".into(), Value::String(text));
    } else {
        let content = if text.is_empty() {
            Value::Null
        } else {
            Value::String(text)
        };
        message.insert("content".into(), content);
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(message))
}

/// A chat-completions request as a Messages body.
///
/// System and developer messages become `system`; consecutive tool
/// messages one user message of `tool_result` blocks; consecutive messages
/// of one role one message; `image_url` parts image blocks (a `data:` URL
/// as base64, else a URL source); `file` parts with a PDF's `file_data`
/// documents; `stop` `stop_sequences`; the larger of `max_completion_tokens`
/// and `max_tokens`, else `default_max_tokens`, `max_tokens`. 400 for what
/// Messages cannot say: `n` above 1, `logprobs`, a `response_format` other
/// than text, tools other than functions, a temperature above 1, tool call
/// arguments that are not a JSON object, parts other than text, images
/// and PDFs.
pub(crate) fn chat_request_to_messages(
    body: &[u8],
    default_max_tokens: u64,
) -> Result<Bytes, GatewayError> {
    let request = ChatRequest::parse(body)?;
    if request.n.is_some_and(|n| n > 1) {
        return Err(bad_request(
            "n",
            "`n` must be 1 for this model: its provider serves the Messages API, which answers with one choice; send one request per choice",
        ));
    }
    if request.extra.get("logprobs") == Some(&Value::Bool(true)) {
        return Err(bad_request(
            "logprobs",
            "`logprobs` cannot be asked of this model: its provider serves the Messages API, which gives no log probabilities; leave it out",
        ));
    }
    if let Some(format) = &request.response_format
        && format.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(bad_request(
            "response_format.type",
            "`response_format` cannot be asked of this model: its provider serves the Messages API, which has no JSON mode; describe the format in the prompt or use a tool",
        ));
    }
    if let Some(temperature) = request.temperature
        && temperature > 1.0
    {
        return Err(bad_request(
            "temperature",
            format!(
                "`temperature` is {temperature}, but this model's provider serves the Messages API, which takes 0 to 1; send at most 1"
            ),
        ));
    }
    let mut system = Vec::new();
    let mut turns: Vec<(MessagesRole, Vec<Value>)> = Vec::new();
    for (index, message) in request.messages.iter().enumerate() {
        let at = format!("messages[{index}]");
        let (role, blocks) = match message.role {
            Role::System | Role::Developer => {
                system.extend(text_of(&format!("{at}.content"), message.content.as_ref())?);
                continue;
            }
            Role::User => (MessagesRole::User, user_blocks(&at, message)?),
            Role::Tool => (MessagesRole::User, vec![tool_result_block(&at, message)?]),
            Role::Assistant => (MessagesRole::Assistant, assistant_blocks(&at, message)?),
            Role::Function => {
                let param = format!("{at}.role");
                return Err(bad_request(
                    &param,
                    format!(
                        "`{param}` is \"function\", the legacy form of a tool result, which this model's provider (the Messages API) cannot take; send `tool` messages with `tool_call_id`"
                    ),
                ));
            }
        };
        // Messages alternate: one role's run of messages is one message
        // (tool results come first in a user message, as chat sends them).
        match turns.last_mut() {
            Some((last, held)) if *last == role => held.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    // An assistant turn with nothing in it (`""`, no calls) is left out:
    // the Messages API refuses empty content.
    turns.retain(|(_, blocks)| !blocks.is_empty());
    let mut merged: Vec<(MessagesRole, Vec<Value>)> = Vec::new();
    for (role, blocks) in turns {
        match merged.last_mut() {
            Some((last, held)) if *last == role => held.extend(blocks),
            _ => merged.push((role, blocks)),
        }
    }
    if merged.is_empty() {
        return Err(bad_request(
            "messages",
            "`messages` has no user or assistant message with content: this model's provider serves the Messages API, which takes the system prompt apart and needs at least one message besides it",
        ));
    }
    let messages: Vec<Value> = merged
        .into_iter()
        .map(|(role, blocks)| json!({"role": role.as_str(), "content": blocks}))
        .collect();
    let mut out = Map::new();
    out.insert("model".into(), Value::String(request.model.clone()));
    out.insert("messages".into(), Value::Array(messages));
    out.insert(
        "max_tokens".into(),
        request
            .max_tokens
            .unwrap_or(default_max_tokens)
            .max(1)
            .into(),
    );
    match system.len() {
        0 => {}
        1 => {
            out.insert("system".into(), Value::String(system.remove(0)));
        }
        _ => {
            let blocks: Vec<Value> = system
                .into_iter()
                .map(|text| json!({"type": "text", "text": text}))
                .collect();
            out.insert("system".into(), Value::Array(blocks));
        }
    }
    if request.stream {
        out.insert("stream".into(), Value::Bool(true));
    }
    if let Some(temperature) = request.temperature {
        out.insert("temperature".into(), temperature.into());
    }
    if let Some(top_p) = request.top_p {
        out.insert("top_p".into(), top_p.into());
    }
    match request.extra.get("stop") {
        Some(Value::String(stop)) => {
            out.insert("stop_sequences".into(), json!([stop]));
        }
        Some(Value::Array(stops)) if !stops.is_empty() => {
            out.insert("stop_sequences".into(), Value::Array(stops.clone()));
        }
        _ => {}
    }
    match request.extra.get("user") {
        None | Some(Value::Null) => {}
        Some(Value::String(user)) => {
            out.insert("metadata".into(), json!({"user_id": user}));
        }
        Some(_) => {
            return Err(bad_request(
                "user",
                "`user` must be a string: it is sent as the Messages API's `metadata.user_id`",
            ));
        }
    }
    let mut tools = Vec::new();
    for (index, tool) in request.tools.iter().flatten().enumerate() {
        tools.push(tool_to_messages(index, tool)?);
    }
    if !tools.is_empty() {
        let mut choice = tool_choice_to_messages(request.extra.get("tool_choice"))?;
        if request.extra.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
            choice
                .get_or_insert_with(|| {
                    let mut auto = Map::new();
                    auto.insert("type".into(), json!("auto"));
                    auto
                })
                .insert("disable_parallel_tool_use".into(), Value::Bool(true));
        }
        if let Some(choice) = choice {
            out.insert("tool_choice".into(), Value::Object(choice));
        }
        out.insert("tools".into(), Value::Array(tools));
    }
    Ok(Bytes::from(Value::Object(out).to_string()))
}

/// The text of a system message or a tool result: a string, or its text
/// parts joined (other parts cannot stand there in the Messages API).
fn text_of(at: &str, content: Option<&MessageContent>) -> Result<Option<String>, GatewayError> {
    match content {
        None => Ok(None),
        Some(MessageContent::Text(text)) => Ok(Some(text.clone())),
        Some(MessageContent::Parts(parts)) => {
            let mut texts = Vec::new();
            for (index, part) in parts.iter().enumerate() {
                match part.get("text").and_then(Value::as_str) {
                    Some(text) if part["type"] == "text" => texts.push(text),
                    _ => {
                        let param = format!("{at}[{index}].type");
                        return Err(bad_request(
                            &param,
                            format!(
                                "`{param}` must be \"text\" here: this model's provider serves the Messages API, whose system prompt and tool results this part cannot stand in"
                            ),
                        ));
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
    }
}

/// A text block, or none for empty text (the Messages API refuses empty
/// text blocks).
fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn user_blocks(at: &str, message: &ChatMessage) -> Result<Vec<Value>, GatewayError> {
    let parts = match &message.content {
        None => return Ok(Vec::new()),
        Some(MessageContent::Text(text)) => return Ok(text_block(text).into_iter().collect()),
        Some(MessageContent::Parts(parts)) => parts,
    };
    let mut blocks = Vec::new();
    for (index, part) in parts.iter().enumerate() {
        let at = format!("{at}.content[{index}]");
        let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "text" => {
                let Some(text) = part.get("text").and_then(Value::as_str) else {
                    return Err(bad_request(
                        &format!("{at}.text"),
                        format!("`{at}.text` must be a string"),
                    ));
                };
                blocks.extend(text_block(text));
            }
            "image_url" => {
                let url = part
                    .get("image_url")
                    .and_then(|image| image.get("url").or(Some(image)))
                    .and_then(Value::as_str);
                let Some(url) = url else {
                    let param = format!("{at}.image_url.url");
                    return Err(bad_request(&param, format!("`{param}` must be a string")));
                };
                let source = image_source(&format!("{at}.image_url.url"), url)?;
                blocks.push(json!({"type": "image", "source": source}));
            }
            "file" => blocks.push(file_block(&at, part)?),
            _ => {
                let param = format!("{at}.type");
                return Err(bad_request(
                    &param,
                    format!(
                        "`{param}` is {kind:?}, which this model's provider cannot take: it serves the Messages API, which takes text, images and PDFs"
                    ),
                ));
            }
        }
    }
    Ok(blocks)
}

/// A `data:` URL split into its media type and base64 data.
fn data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (media_type, data) = rest.split_once(";base64,")?;
    Some((media_type, data))
}

fn image_source(param: &str, url: &str) -> Result<Value, GatewayError> {
    if let Some((media_type, data)) = data_url(url) {
        if !IMAGE_MEDIA_TYPES.contains(&media_type) {
            return Err(bad_request(
                param,
                format!(
                    "`{param}` is an image of type {media_type:?}, which this model's provider (the Messages API) cannot take; send JPEG, PNG, GIF or WebP"
                ),
            ));
        }
        return Ok(json!({"type": "base64", "media_type": media_type, "data": data}));
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(json!({"type": "url", "url": url}));
    }
    Err(bad_request(
        param,
        format!("`{param}` must be an http(s) URL or a base64 `data:` URL"),
    ))
}

fn file_block(at: &str, part: &Value) -> Result<Value, GatewayError> {
    let param = format!("{at}.file.file_data");
    let file = part.get("file");
    let Some(file_data) = file
        .and_then(|file| file.get("file_data"))
        .and_then(Value::as_str)
    else {
        return Err(bad_request(
            &param,
            format!(
                "`{param}` is required here: this model's provider serves the Messages API, which cannot read files by id; send the PDF inline as a base64 `data:` URL"
            ),
        ));
    };
    match data_url(file_data) {
        Some(("application/pdf", data)) => {
            let mut document = Map::new();
            document.insert("type".into(), json!("document"));
            document.insert(
                "source".into(),
                json!({"type": "base64", "media_type": "application/pdf", "data": data}),
            );
            if let Some(name) = file
                .and_then(|file| file.get("filename"))
                .and_then(Value::as_str)
            {
                document.insert("title".into(), json!(name));
            }
            Ok(Value::Object(document))
        }
        _ => Err(bad_request(
            &param,
            format!(
                "`{param}` must be a PDF as a base64 `data:` URL (data:application/pdf;base64,…): this model's provider serves the Messages API, which takes no other files"
            ),
        )),
    }
}

fn tool_result_block(at: &str, message: &ChatMessage) -> Result<Value, GatewayError> {
    let id = message
        .extra
        .get("tool_call_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let text = text_of(&format!("{at}.content"), message.content.as_ref())?.unwrap_or_default();
    Ok(json!({"type": "tool_result", "tool_use_id": id, "content": text}))
}

fn assistant_blocks(at: &str, message: &ChatMessage) -> Result<Vec<Value>, GatewayError> {
    if message
        .extra
        .get("function_call")
        .is_some_and(Value::is_object)
    {
        let param = format!("{at}.function_call");
        return Err(bad_request(
            &param,
            format!(
                "`{param}` is the legacy form of a tool call, which this model's provider (the Messages API) cannot take; send `tool_calls`"
            ),
        ));
    }
    let mut blocks = Vec::new();
    match &message.content {
        None => {}
        Some(MessageContent::Text(text)) => blocks.extend(text_block(text)),
        Some(MessageContent::Parts(parts)) => {
            for (index, part) in parts.iter().enumerate() {
                // An assistant's parts are text, or a refusal's text.
                let text = part
                    .get("text")
                    .or_else(|| part.get("refusal"))
                    .and_then(Value::as_str);
                let Some(text) = text else {
                    let param = format!("{at}.content[{index}].type");
                    return Err(bad_request(
                        &param,
                        format!(
                            "`{param}` must be \"text\" or \"refusal\" in an assistant message"
                        ),
                    ));
                };
                blocks.extend(text_block(text));
            }
        }
    }
    let calls = match message.extra.get("tool_calls") {
        None | Some(Value::Null) => return Ok(blocks),
        Some(Value::Array(calls)) => calls,
        Some(_) => {
            let param = format!("{at}.tool_calls");
            return Err(bad_request(&param, format!("`{param}` must be an array")));
        }
    };
    for (index, call) in calls.iter().enumerate() {
        let at = format!("{at}.tool_calls[{index}]");
        let string = |field: &str, path: &str| match call.pointer(path).and_then(Value::as_str) {
            Some(value) => Ok(value),
            None => {
                let param = format!("{at}.{field}");
                Err(bad_request(&param, format!("`{param}` must be a string")))
            }
        };
        let id = string("id", "/id")?;
        let name = string("function.name", "/function/name")?;
        let arguments = string("function.arguments", "/function/arguments")?;
        // A call without arguments may send "".
        let input = if arguments.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            match serde_json::from_str::<Value>(arguments) {
                Ok(input @ Value::Object(_)) => input,
                _ => {
                    let param = format!("{at}.function.arguments");
                    return Err(bad_request(
                        &param,
                        format!(
                            "`{param}` must be a JSON object as a string: this model's provider serves the Messages API, which takes a tool call's input as an object"
                        ),
                    ));
                }
            }
        };
        blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
    }
    Ok(blocks)
}

fn tool_to_messages(index: usize, tool: &Value) -> Result<Value, GatewayError> {
    let kind = tool
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("function");
    if kind != "function" {
        let param = format!("tools[{index}].type");
        return Err(bad_request(
            &param,
            format!(
                "`{param}` is {kind:?}: this model's provider serves the Messages API, which takes function tools only here"
            ),
        ));
    }
    let function = &tool["function"];
    let mut out = Map::new();
    out.insert("name".into(), function["name"].clone());
    if let Some(description) = function.get("description").and_then(Value::as_str) {
        out.insert("description".into(), json!(description));
    }
    let schema = match function.get("parameters") {
        Some(schema @ Value::Object(_)) => schema.clone(),
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(_) => {
            let param = format!("tools[{index}].function.parameters");
            return Err(bad_request(
                &param,
                format!("`{param}` must be a JSON Schema object"),
            ));
        }
    };
    out.insert("input_schema".into(), schema);
    Ok(Value::Object(out))
}

fn tool_choice_to_messages(
    choice: Option<&Value>,
) -> Result<Option<Map<String, Value>>, GatewayError> {
    let kind = match choice {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(choice)) => match choice.as_str() {
            "auto" => "auto",
            "required" => "any",
            "none" => "none",
            _ => {
                return Err(bad_request(
                    "tool_choice",
                    format!(
                        "`tool_choice` is {choice:?}; use \"auto\", \"required\", \"none\" or a function"
                    ),
                ));
            }
        },
        Some(choice) => {
            let name = choice
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| choice["type"] == "function");
            let Some(name) = name else {
                return Err(bad_request(
                    "tool_choice",
                    "`tool_choice` must be \"auto\", \"required\", \"none\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
                ));
            };
            let mut out = Map::new();
            out.insert("type".into(), json!("tool"));
            out.insert("name".into(), json!(name));
            return Ok(Some(out));
        }
    };
    let mut out = Map::new();
    out.insert("type".into(), json!(kind));
    Ok(Some(out))
}

/// The fields every chat completions body the translations write starts
/// with, in this order; callers add the rest.
pub(super) fn chat_base(
    model: &str,
    messages: Vec<Value>,
    max_tokens: Option<u64>,
    stream: bool,
    temperature: Option<f64>,
    top_p: Option<f64>,
) -> Map<String, Value> {
    let mut chat = Map::new();
    chat.insert("model".into(), Value::String(model.to_owned()));
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(max_tokens) = max_tokens {
        chat.insert("max_tokens".into(), max_tokens.into());
    }
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
        // Always: the gateway charges a stream from the usage it ends with.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(temperature) = temperature {
        chat.insert("temperature".into(), temperature.into());
    }
    if let Some(top_p) = top_p {
        chat.insert("top_p".into(), top_p.into());
    }
    chat
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn to_chat(request: Value) -> Result<Value, GatewayError> {
        messages_request_to_chat(request.to_string().as_bytes())
            .map(|bytes| serde_json::from_slice(&bytes).unwrap())
    }

    fn to_messages(request: Value, default_max_tokens: u64) -> Result<Value, GatewayError> {
        chat_request_to_messages(request.to_string().as_bytes(), default_max_tokens)
            .map(|bytes| serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn a_messages_request_becomes_a_chat_request() {
        let chat = to_chat(json!({
            "model": "anthropic/claude-sonnet-4.5", "max_tokens": 2048, "stream": true,
            "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END"],
            "metadata": {"user_id": "u-1"},
            "system": [{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}},
                       {"type": "text", "text": "Use tools."}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Look:", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
                    {"type": "document", "title": "spec.pdf", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Here you go."},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 C"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "rain"}], "is_error": true},
                ]},
                {"role": "assistant", "content": "Done."},
            ],
            "tools": [{"name": "weather", "description": "Weather now", "cache_control": {"type": "ephemeral"},
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        }))
        .unwrap();
        assert_eq!(
            chat,
            json!({
                "model": "anthropic/claude-sonnet-4.5", "max_tokens": 2048,
                "stream": true, "stream_options": {"include_usage": true},
                "temperature": 0.5, "top_p": 0.9, "stop": ["END"], "user": "u-1",
                "messages": [
                    {"role": "system", "content": "Be terse.\n\nUse tools."},
                    {"role": "user", "content": [
                        {"type": "text", "text": "Look:"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
                        {"type": "file", "file": {"filename": "spec.pdf", "file_data": "data:application/pdf;base64,JVBE"}},
                        {"type": "text", "text": "notes"},
                    ]},
                    {"role": "assistant", "content": "Checking.", "tool_calls": [
                        {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "toolu_2", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
                    ]},
                    // Tool results first, then the rest of the user's message.
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "12 C"},
                    {"role": "tool", "tool_call_id": "toolu_2", "content": "rain"},
                    {"role": "user", "content": "Here you go."},
                    {"role": "assistant", "content": "Done."},
                ],
                "tools": [{"type": "function", "function": {"name": "weather", "description": "Weather now",
                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
                "tool_choice": "required", "parallel_tool_calls": false,
            })
        );
        ChatRequest::parse(chat.to_string().as_bytes()).unwrap();
    }

    #[test]
    fn tool_choices_map_to_chat_and_need_tools() {
        let with_choice = |choice: Value| {
            to_chat(json!({"model": "a/b", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}],
                "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": choice}))
            .unwrap()
        };
        assert_eq!(with_choice(json!({"type": "auto"}))["tool_choice"], "auto");
        assert_eq!(with_choice(json!({"type": "none"}))["tool_choice"], "none");
        assert_eq!(
            with_choice(json!({"type": "tool", "name": "f"}))["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert!(
            with_choice(json!({"type": "auto"}))
                .get("parallel_tool_calls")
                .is_none()
        );
        let without_tools = to_chat(
            json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}),
        )
        .unwrap();
        assert_eq!(
            without_tools,
            json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"}]})
        );
    }

    #[test]
    fn what_chat_cannot_say_is_a_400_naming_the_field() {
        for (request, param) in [
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"}],
                       "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"}], "mcp_servers": []}),
                "mcp_servers",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}]}),
                "messages[0].content[0].source.type",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "x"},
                    {"type": "document", "source": {"type": "url", "url": "https://e.com/a.pdf"}}]}]}),
                "messages[0].content[1].source.type",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [
                        {"type": "image", "source": {"type": "url", "url": "https://e.com/a.png"}}]}]}]}),
                "messages[0].content[0].content[0].type",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": [
                    {"type": "search_result", "source": "s", "title": "t", "content": []}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]}]}),
                "messages[1].content[0].type",
            ),
        ] {
            let error = to_chat(request.clone()).unwrap_err();
            assert_eq!(error.status(), 400, "{request}");
            assert_eq!(error.metadata()["param"], param, "{}", error.message());
        }
        // The parser's own refusals pass as they are.
        let error = to_chat(json!({"model": "a/b", "messages": []})).unwrap_err();
        assert_eq!(error.metadata()["param"], "messages");
    }

    #[test]
    fn a_chat_request_becomes_a_messages_request() {
        let messages = to_messages(
            json!({
                "model": "openai/gpt-4o", "max_completion_tokens": 300, "max_tokens": 200,
                "stream": true, "stream_options": {"include_usage": true},
                "temperature": 0.2, "top_p": 0.5, "stop": "END", "user": "u-9", "n": 1,
                "seed": 7, "parallel_tool_calls": false, "tool_choice": "required",
                "messages": [
                    {"role": "system", "content": "Be terse."},
                    {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                    {"role": "user", "content": [
                        {"type": "text", "text": "Look:"},
                        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "high"}},
                        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"}},
                    ]},
                    {"role": "user", "content": "And?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": ""}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
                    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
                    {"role": "user", "content": "Thanks"},
                    {"role": "assistant", "content": ""},
                ],
                "tools": [
                    {"type": "function", "function": {"name": "weather", "description": "Weather now",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                    {"type": "function", "function": {"name": "time"}},
                ],
            }),
            4096,
        )
        .unwrap();
        assert_eq!(
            messages,
            json!({
                "model": "openai/gpt-4o", "max_tokens": 300, "stream": true,
                "temperature": 0.2, "top_p": 0.5, "stop_sequences": ["END"],
                "metadata": {"user_id": "u-9"},
                "system": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Use tools."}],
                "messages": [
                    {"role": "user", "content": [
                        {"type": "text", "text": "Look:"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                        {"type": "document", "title": "a.pdf", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
                        {"type": "text", "text": "And?"},
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "call_2", "name": "time", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "12 C"},
                        {"type": "tool_result", "tool_use_id": "call_2", "content": "noon"},
                        {"type": "text", "text": "Thanks"},
                    ]},
                ],
                "tools": [
                    {"name": "weather", "description": "Weather now",
                     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                    {"name": "time", "input_schema": {"type": "object", "properties": {}}},
                ],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            })
        );
        MessagesRequest::parse(messages.to_string().as_bytes()).unwrap();
    }

    #[test]
    fn a_chat_request_without_a_bound_takes_the_default_and_its_choice_maps() {
        let plain = to_messages(
            json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"}], "stop": ["a", "b"],
                   "tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": {"type": "function", "function": {"name": "f"}}}),
            777,
        )
        .unwrap();
        assert_eq!(plain["max_tokens"], 777);
        assert_eq!(plain["stop_sequences"], json!(["a", "b"]));
        assert_eq!(plain["tool_choice"], json!({"type": "tool", "name": "f"}));
        assert!(plain.get("stream").is_none());
        let parallel_off = to_messages(
            json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"}], "parallel_tool_calls": false,
                   "tools": [{"type": "function", "function": {"name": "f"}}]}),
            1,
        )
        .unwrap();
        assert_eq!(
            parallel_off["tool_choice"],
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
    }

    #[test]
    fn what_messages_cannot_say_is_a_400_naming_the_field() {
        let user = json!({"role": "user", "content": "Hi"});
        for (request, param) in [
            (json!({"model": "a/b", "messages": [user], "n": 2}), "n"),
            (
                json!({"model": "a/b", "messages": [user], "logprobs": true}),
                "logprobs",
            ),
            (
                json!({"model": "a/b", "messages": [user], "temperature": 1.5}),
                "temperature",
            ),
            (
                json!({"model": "a/b", "messages": [user], "user": 5}),
                "user",
            ),
            (
                json!({"model": "a/b", "messages": [user], "response_format": {"type": "json_object"}}),
                "response_format.type",
            ),
            (
                json!({"model": "a/b", "messages": [user], "tools": [{"type": "custom", "custom": {"name": "x"}}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "a/b", "messages": [user, {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}),
                "messages[1].tool_calls[0].function.arguments",
            ),
            (
                json!({"model": "a/b", "messages": [user, {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}),
                "messages[1].tool_calls[0].function.arguments",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": [
                    {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}]}]}),
                "messages[0].content[0].image_url.url",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "user", "content": [
                    {"type": "file", "file": {"file_id": "file-1"}}]}]}),
                "messages[0].content[0].file.file_data",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "system", "content": "only a system prompt"}]}),
                "messages",
            ),
            (
                json!({"model": "a/b", "messages": [{"role": "function", "name": "f", "content": "x"}]}),
                "messages[0].role",
            ),
        ] {
            let error = to_messages(request.clone(), 100).unwrap_err();
            assert_eq!(error.status(), 400, "{request}: {}", error.message());
            assert_eq!(error.metadata()["param"], param, "{}", error.message());
        }
    }

    const MODELS: [&str; 3] = [
        "anthropic/claude-sonnet-4.5",
        "openai/gpt-4o",
        "meta/llama-3:free",
    ];

    fn text() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 .,!?\"\\\\é\n]{1,24}"
    }

    fn input() -> impl Strategy<Value = Value> {
        prop::collection::btree_map(
            "[a-z]{1,6}",
            prop_oneof![
                any::<i64>().prop_map(Value::from),
                text().prop_map(Value::from),
                any::<bool>().prop_map(Value::from),
            ],
            0..4,
        )
        .prop_map(|map| Value::Object(map.into_iter().collect()))
    }

    /// A user block: text, a base64 or URL image, a tool result.
    fn user_block() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(|text| json!({"type": "text", "text": text})),
            "[A-Za-z0-9+/]{4,12}".prop_map(|data| json!({"type": "image", "source":
                {"type": "base64", "media_type": "image/png", "data": data}})),
            "[a-z]{1,8}".prop_map(|name| json!({"type": "image", "source":
                {"type": "url", "url": format!("https://example.com/{name}.png")}})),
            ("[a-z0-9_]{1,8}", text()).prop_map(|(id, text)| json!({"type": "tool_result",
                "tool_use_id": id, "content": text})),
        ]
    }

    /// An assistant block: text, a tool call, thinking.
    fn assistant_block() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(|text| json!({"type": "text", "text": text})),
            ("[a-z0-9_]{1,8}", "[a-z_]{1,8}", input()).prop_map(|(id, name, input)| json!(
                {"type": "tool_use", "id": id, "name": name, "input": input})),
            text().prop_map(
                |thinking| json!({"type": "thinking", "thinking": thinking, "signature": "s"})
            ),
        ]
    }

    fn message() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(|text| json!({"role": "user", "content": text})),
            text().prop_map(|text| json!({"role": "assistant", "content": text})),
            prop::collection::vec(user_block(), 0..4)
                .prop_map(|blocks| json!({"role": "user", "content": blocks})),
            prop::collection::vec(assistant_block(), 0..4)
                .prop_map(|blocks| json!({"role": "assistant", "content": blocks})),
        ]
    }

    prop_compose! {
        fn messages_request()(
            model in prop::sample::select(&MODELS[..]),
            messages in prop::collection::vec(message(), 1..6),
            max_tokens in prop::option::of(1u64..200_000),
            stream in any::<bool>(),
            system in prop::option::of(text()),
            temperature in prop::option::of(0.0f64..=1.0),
            tools in prop::collection::vec(("[a-z_]{1,8}", prop::option::of(text())), 0..3),
            stops in prop::option::of(prop::collection::vec(text(), 0..3)),
        ) -> Value {
            let mut request = json!({"model": model, "messages": messages, "stream": stream});
            if let Some(max_tokens) = max_tokens { request["max_tokens"] = max_tokens.into(); }
            if let Some(system) = system { request["system"] = system.into(); }
            if let Some(temperature) = temperature { request["temperature"] = temperature.into(); }
            if let Some(stops) = stops { request["stop_sequences"] = stops.into(); }
            if !tools.is_empty() {
                request["tools"] = tools.into_iter().map(|(name, description)| json!(
                    {"name": name, "description": description, "input_schema": {"type": "object"}})).collect();
                request["tool_choice"] = json!({"type": "auto"});
            }
            request
        }
    }

    fn chat_message() -> impl Strategy<Value = Value> {
        let part = prop_oneof![
            text().prop_map(|text| json!({"type": "text", "text": text})),
            "[A-Za-z0-9+/]{4,12}".prop_map(|data| json!({"type": "image_url",
                "image_url": {"url": format!("data:image/webp;base64,{data}")}})),
            "[a-z]{1,8}".prop_map(|name| json!({"type": "image_url",
                "image_url": {"url": format!("http://example.com/{name}.gif")}})),
        ];
        let call = ("[a-z0-9_]{1,8}", "[a-z_]{1,8}", input()).prop_map(|(id, name, input)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}})
        });
        prop_oneof![
            text().prop_map(|text| json!({"role": "system", "content": text})),
            text().prop_map(|text| json!({"role": "user", "content": text})),
            prop::collection::vec(part, 1..4)
                .prop_map(|parts| json!({"role": "user", "content": parts})),
            text().prop_map(|text| json!({"role": "assistant", "content": text})),
            (prop::option::of(text()), prop::collection::vec(call, 1..3))
                .prop_map(|(text, calls)| json!(
                {"role": "assistant", "content": text, "tool_calls": calls})),
            ("[a-z0-9_]{1,8}", text()).prop_map(|(id, text)| json!(
                {"role": "tool", "tool_call_id": id, "content": text})),
        ]
    }

    prop_compose! {
        fn chat_request()(
            model in prop::sample::select(&MODELS[..]),
            first in text(),
            messages in prop::collection::vec(chat_message(), 0..6),
            max_tokens in prop::option::of(1u64..200_000),
            max_completion_tokens in prop::option::of(1u64..200_000),
            stream in any::<bool>(),
            n in prop::option::of(0u64..=1),
            tools in prop::collection::vec("[a-z_]{1,8}", 0..3),
        ) -> Value {
            let mut all = vec![json!({"role": "user", "content": first})];
            all.extend(messages);
            let mut request = json!({"model": model, "messages": all, "stream": stream});
            if let Some(max_tokens) = max_tokens { request["max_tokens"] = max_tokens.into(); }
            if let Some(max) = max_completion_tokens { request["max_completion_tokens"] = max.into(); }
            if let Some(n) = n.filter(|n| *n == 1) { request["n"] = n.into(); }
            if !tools.is_empty() {
                request["tools"] = tools.into_iter().map(|name| json!(
                    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}})).collect();
                request["tool_choice"] = json!("auto");
            }
            request
        }
    }

    fn count_tool_uses(messages: &[crate::context::InputMessage]) -> usize {
        messages
            .iter()
            .filter_map(|message| match &message.content {
                MessagesContent::Blocks(blocks) => Some(blocks),
                MessagesContent::Text(_) => None,
            })
            .flatten()
            .filter(|block| matches!(block.kind, BlockKind::ToolUse { .. }))
            .count()
    }

    fn count_tool_calls(messages: &[ChatMessage]) -> usize {
        messages
            .iter()
            .filter_map(|message| message.extra.get("tool_calls").and_then(Value::as_array))
            .map(Vec::len)
            .sum()
    }

    proptest! {
        #[test]
        fn a_valid_messages_request_translates_to_a_chat_request_the_gateway_accepts(request in messages_request()) {
            let body = request.to_string();
            let parsed = MessagesRequest::parse(body.as_bytes()).unwrap();
            let chat = messages_request_to_chat(body.as_bytes()).unwrap();
            let chat = ChatRequest::parse(&chat).unwrap();
            prop_assert_eq!(&chat.model, &parsed.model);
            prop_assert_eq!(chat.stream, parsed.stream);
            prop_assert_eq!(chat.stream_usage_requested, parsed.stream);
            prop_assert_eq!(chat.max_tokens, parsed.max_tokens);
            prop_assert_eq!(count_tool_calls(&chat.messages), count_tool_uses(&parsed.messages));
            prop_assert_eq!(chat.tools.map_or(0, |tools| tools.len()), parsed.tools.map_or(0, |tools| tools.len()));
        }

        #[test]
        fn a_valid_chat_request_translates_to_a_messages_request_the_gateway_accepts(
            request in chat_request(),
            default_max_tokens in 1u64..100_000,
        ) {
            let body = request.to_string();
            let parsed = ChatRequest::parse(body.as_bytes()).unwrap();
            let messages = chat_request_to_messages(body.as_bytes(), default_max_tokens).unwrap();
            let messages = MessagesRequest::parse(&messages).unwrap();
            prop_assert_eq!(&messages.model, &parsed.model);
            prop_assert_eq!(messages.stream, parsed.stream);
            prop_assert_eq!(messages.max_tokens, Some(parsed.max_tokens.unwrap_or(default_max_tokens)));
            prop_assert_eq!(count_tool_uses(&messages.messages), count_tool_calls(&parsed.messages));
            // Roles alternate.
            for pair in messages.messages.windows(2) {
                prop_assert_ne!(pair[0].role, pair[1].role);
            }
        }

        #[test]
        fn translating_a_request_there_and_back_keeps_what_both_say(request in messages_request()) {
            let chat = messages_request_to_chat(request.to_string().as_bytes()).unwrap();
            let back = match chat_request_to_messages(&chat, 1) {
                Ok(back) => back,
                // Only a conversation of empty messages, which Anthropic
                // refuses too, has nothing to send back.
                Err(error) => {
                    prop_assert_eq!(&error.metadata()["param"], "messages");
                    return Ok(());
                }
            };
            let before = MessagesRequest::parse(request.to_string().as_bytes()).unwrap();
            let after = MessagesRequest::parse(&back).unwrap();
            prop_assert_eq!(after.max_tokens, Some(before.max_tokens.unwrap_or(1)));
            prop_assert_eq!(count_tool_uses(&after.messages), count_tool_uses(&before.messages));
            prop_assert_eq!(after.temperature, before.temperature);
        }
    }
}
