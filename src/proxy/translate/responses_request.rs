//! A Responses request (`POST /v1/responses`) as a chat-completions body,
//! for a provider that serves chat only: Codex CLI on any chat model.
//! Read with the gateway's own parser ([`ResponsesRequest::parse`]), so
//! what reaches here was already checked; what chat cannot say is a 400
//! naming the field.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::context::{
    ContentPart, FileSource, ImageSource, InputItem, ItemKind, PartKind, ResponsesContent,
    ResponsesInput, ResponsesRequest, ResponsesRole, ResponsesToolChoice, ResponsesToolKind,
    TextFormat,
};
use crate::error::GatewayError;
use crate::json_input::bad_request;

/// A Responses request as a chat-completions body.
///
/// - `instructions` is the first system message; a string `input` one user
///   message; message items messages (system and developer ones as system
///   messages, which every chat server reads), their `input_text` and
///   `output_text` parts text, `input_image` an `image_url` part,
///   `input_file` (inline or by file id) a `file` part; an assistant's
///   parts, and a system message's, joined as its text.
/// - `function_call` items are an assistant's `tool_calls`, merged into
///   the assistant message just before them (Codex sends the text and the
///   calls of one turn as separate items); `function_call_output` items
///   `tool` messages. `custom_tool_call` items (and their outputs) pass the
///   same way, their input as the arguments `{"input": …}`, so an earlier
///   conversation reads whole. `reasoning` items are dropped: chat cannot
///   send reasoning back.
/// - Tools: `function` tools are chat's function tools. Every other kind
///   (`web_search`, `namespace`, `custom`, `local_shell`, `file_search`,
///   `mcp`, …) runs on the Responses API's servers or needs its grammar,
///   which a chat provider does not have: it is left out, and the model
///   simply cannot call it. Codex sends such tools with every request, so
///   refusing them would make it unusable on chat models.
/// - `tool_choice` maps (`auto`, `none`, `required`, a function by name);
///   with no function tool left, it and `parallel_tool_calls` are left out
///   too (chat refuses them without tools). `text.format` is
///   `response_format`; `reasoning.effort` `reasoning_effort`;
///   `max_output_tokens` `max_tokens`; `temperature`, `top_p` and `user`
///   pass; a stream asks for its usage (`stream_options.include_usage`),
///   which the gateway charges from.
/// - Dropped, having no chat meaning every chat server takes: `store`
///   (never true here), `include`, `metadata`, `prompt_cache_key`,
///   `truncation`, `service_tier`, `max_tool_calls`, `reasoning.summary`,
///   `text.verbosity` and fields the gateway does not know.
///
/// 400 for what chat cannot say: images by file id, files by URL, content
/// parts and items of other types, a tool output holding more than text,
/// a `tool_choice` naming a tool that is not a function, and an input with
/// no message left.
pub(crate) fn responses_request_to_chat(body: &[u8]) -> Result<Bytes, GatewayError> {
    let request = ResponsesRequest::parse(body)?;
    let mut messages: Vec<Value> = Vec::new();
    if let Some(instructions) = &request.instructions {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    match &request.input {
        ResponsesInput::Text(text) => messages.push(json!({"role": "user", "content": text})),
        ResponsesInput::Items(items) => {
            for (index, item) in items.iter().enumerate() {
                item_to_chat(&format!("input[{index}]"), item, &mut messages)?;
            }
        }
    }
    if messages.is_empty() {
        return Err(bad_request(
            "input",
            "`input` has no message chat completions can send: this model's provider serves chat completions, which cannot take reasoning alone; send a message",
        ));
    }
    let mut chat = super::request::chat_base(
        &request.model,
        messages,
        request.max_output_tokens,
        request.stream,
        request.temperature,
        request.top_p,
    );
    if let Some(user) = &request.user {
        chat.insert("user".into(), Value::String(user.clone()));
    }
    if let Some(effort) = request
        .reasoning
        .as_ref()
        .and_then(|reasoning| reasoning.effort.as_ref())
    {
        chat.insert("reasoning_effort".into(), Value::String(effort.clone()));
    }
    match request.text.as_ref().and_then(|text| text.format.as_ref()) {
        None | Some(TextFormat::Text) => {}
        Some(TextFormat::JsonObject) => {
            chat.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(TextFormat::JsonSchema {
            name,
            schema,
            extra,
        }) => {
            let mut json_schema = Map::new();
            json_schema.insert("name".into(), Value::String(name.clone()));
            json_schema.insert("schema".into(), Value::Object(schema.clone()));
            for field in ["strict", "description"] {
                if let Some(value) = extra.get(field).filter(|value| !value.is_null()) {
                    json_schema.insert(field.into(), value.clone());
                }
            }
            chat.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": json_schema}),
            );
        }
    }
    let mut tools = Vec::new();
    for tool in request.tools.iter().flatten() {
        if let ResponsesToolKind::Function {
            name,
            description,
            parameters,
        } = &tool.kind
        {
            let mut function = Map::new();
            function.insert("name".into(), Value::String(name.clone()));
            if let Some(description) = description {
                function.insert("description".into(), Value::String(description.clone()));
            }
            let parameters = parameters.clone().map_or_else(
                || json!({"type": "object", "properties": {}}),
                Value::Object,
            );
            function.insert("parameters".into(), parameters);
            if let Some(strict @ Value::Bool(_)) = tool.extra.get("strict") {
                function.insert("strict".into(), strict.clone());
            }
            tools.push(json!({"type": "function", "function": function}));
        }
    }
    let choice = request
        .tool_choice
        .as_ref()
        .map(tool_choice_to_chat)
        .transpose()?;
    // Chat refuses `tool_choice` and `parallel_tool_calls` without tools.
    if !tools.is_empty() {
        if let Some(choice) = choice {
            chat.insert("tool_choice".into(), choice);
        }
        if let Some(parallel) = request.parallel_tool_calls {
            chat.insert("parallel_tool_calls".into(), Value::Bool(parallel));
        }
        chat.insert("tools".into(), Value::Array(tools));
    } else if choice.as_ref().is_some_and(Value::is_object) {
        return Err(bad_request(
            "tool_choice.name",
            "`tool_choice.name` names a function, but the request has no function tool to call; send the function in `tools` or leave `tool_choice` out",
        ));
    }
    Ok(Bytes::from(Value::Object(chat).to_string()))
}

fn tool_choice_to_chat(choice: &ResponsesToolChoice) -> Result<Value, GatewayError> {
    match choice {
        ResponsesToolChoice::Mode(mode) => Ok(Value::String(mode.clone())),
        ResponsesToolChoice::Tool {
            tool_type,
            name: Some(name),
            ..
        } if tool_type == "function" => Ok(json!({"type": "function", "function": {"name": name}})),
        ResponsesToolChoice::Tool { tool_type, .. } => Err(unexpressible_choice(tool_type)),
    }
}

fn unexpressible_choice(tool_type: &str) -> GatewayError {
    bad_request(
        "tool_choice.type",
        format!(
            "`tool_choice.type` is {tool_type:?}, which this model's provider cannot be held to: it serves chat completions, which take function tools only (the others are left out); send \"auto\", \"required\", \"none\" or a function tool by name"
        ),
    )
}

/// One input item as chat messages, appended to `messages`.
fn item_to_chat(at: &str, item: &InputItem, messages: &mut Vec<Value>) -> Result<(), GatewayError> {
    match &item.kind {
        ItemKind::Message { role, content } => {
            let at = format!("{at}.content");
            let message = match role {
                ResponsesRole::System | ResponsesRole::Developer => {
                    json!({"role": "system", "content": joined_text(&at, content)?})
                }
                ResponsesRole::Assistant => {
                    json!({"role": "assistant", "content": joined_text(&at, content)?})
                }
                ResponsesRole::User => {
                    json!({"role": "user", "content": user_content(&at, content)?})
                }
            };
            messages.push(message);
        }
        ItemKind::FunctionCall {
            call_id,
            name,
            arguments,
        } => push_tool_call(messages, call_id, name, arguments.clone()),
        ItemKind::CustomToolCall {
            call_id,
            name,
            input,
        } => push_tool_call(messages, call_id, name, json!({"input": input}).to_string()),
        ItemKind::FunctionCallOutput { call_id, output }
        | ItemKind::CustomToolCallOutput { call_id, output } => {
            let text = joined_text(&format!("{at}.output"), output)?;
            messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": text}));
        }
        ItemKind::Reasoning { .. } => {}
        ItemKind::Other { kind } => {
            let param = format!("{at}.type");
            return Err(bad_request(
                &param,
                format!(
                    "`{param}` is {kind:?}, an item this model's provider cannot take: it serves chat completions, which have messages, function calls and their outputs only; leave it out or choose a model served through the Responses API"
                ),
            ));
        }
    }
    Ok(())
}

/// A tool call, merged into the assistant message just before it (one
/// turn's calls are one assistant message in chat), else a new one.
fn push_tool_call(messages: &mut Vec<Value>, call_id: &str, name: &str, arguments: String) {
    let call = json!({
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    });
    if let Some(Value::Object(last)) = messages.last_mut()
        && last.get("role").and_then(Value::as_str) == Some("assistant")
    {
        if last.get("content").is_some_and(|content| content == "") {
            last.insert("content".into(), Value::Null);
        }
        match last.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(call),
            _ => {
                last.insert("tool_calls".into(), Value::Array(vec![call]));
            }
        }
        return;
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
}

/// The text of a content (its text, output text and refusal parts joined):
/// what a system or assistant message and a tool output hold in chat.
fn joined_text(at: &str, content: &ResponsesContent) -> Result<String, GatewayError> {
    let parts = match content {
        ResponsesContent::Text(text) => return Ok(text.clone()),
        ResponsesContent::Parts(parts) => parts,
    };
    let mut text = String::new();
    for (index, part) in parts.iter().enumerate() {
        match &part.kind {
            PartKind::InputText { text: part }
            | PartKind::OutputText { text: part }
            | PartKind::Refusal { refusal: part } => text.push_str(part),
            _ => {
                let param = format!("{at}[{index}].type");
                return Err(bad_request(
                    &param,
                    format!(
                        "`{param}` is {:?}, which cannot stand here for this model's provider: it serves chat completions, whose system and assistant messages and tool outputs hold text only; send text",
                        part_type(part)
                    ),
                ));
            }
        }
    }
    Ok(text)
}

/// A user message's content: a string stays one; parts become chat parts
/// (one text part alone is sent as a string, which every chat server reads).
fn user_content(at: &str, content: &ResponsesContent) -> Result<Value, GatewayError> {
    let parts = match content {
        ResponsesContent::Text(text) => return Ok(Value::String(text.clone())),
        ResponsesContent::Parts(parts) => parts,
    };
    let mut out = Vec::new();
    for (index, part) in parts.iter().enumerate() {
        let at = format!("{at}[{index}]");
        out.push(part_to_chat(&at, part)?);
    }
    if out.len() == 1 && out[0]["type"] == "text" {
        return Ok(out.swap_remove(0)["text"].take());
    }
    if out.is_empty() {
        return Ok(Value::String(String::new()));
    }
    Ok(Value::Array(out))
}

fn part_to_chat(at: &str, part: &ContentPart) -> Result<Value, GatewayError> {
    Ok(match &part.kind {
        PartKind::InputText { text }
        | PartKind::OutputText { text }
        | PartKind::Refusal { refusal: text } => json!({"type": "text", "text": text}),
        PartKind::InputImage {
            source: ImageSource::Url(url),
        } => {
            let mut image = Map::new();
            image.insert("url".into(), Value::String(url.clone()));
            if let Some(detail @ Value::String(_)) = part.extra.get("detail") {
                image.insert("detail".into(), detail.clone());
            }
            json!({"type": "image_url", "image_url": image})
        }
        PartKind::InputImage {
            source: ImageSource::FileId(_),
        } => {
            let param = format!("{at}.file_id");
            return Err(bad_request(
                &param,
                format!(
                    "`{param}` cannot be sent to this model: its provider serves chat completions, which take images by URL or as a base64 `data:` URL in `image_url`; send the image that way"
                ),
            ));
        }
        PartKind::InputFile { source } => {
            let mut file = Map::new();
            match source {
                FileSource::Data(data) => {
                    file.insert("file_data".into(), Value::String(data.clone()));
                }
                FileSource::FileId(id) => {
                    file.insert("file_id".into(), Value::String(id.clone()));
                }
                FileSource::Url(_) => {
                    let param = format!("{at}.file_url");
                    return Err(bad_request(
                        &param,
                        format!(
                            "`{param}` cannot be sent to this model: its provider serves chat completions, which take files inline (`file_data`) or by file id; send the file inline"
                        ),
                    ));
                }
            }
            if let Some(filename @ Value::String(_)) = part.extra.get("filename") {
                file.insert("filename".into(), filename.clone());
            }
            json!({"type": "file", "file": file})
        }
        PartKind::Other { kind } => {
            let param = format!("{at}.type");
            return Err(bad_request(
                &param,
                format!(
                    "`{param}` is {kind:?}, which this model's provider cannot take: it serves chat completions, which take text, images and files"
                ),
            ));
        }
    })
}

fn part_type(part: &ContentPart) -> &str {
    match &part.kind {
        PartKind::InputText { .. } => "input_text",
        PartKind::InputImage { .. } => "input_image",
        PartKind::InputFile { .. } => "input_file",
        PartKind::OutputText { .. } => "output_text",
        PartKind::Refusal { .. } => "refusal",
        PartKind::Other { kind } => kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ChatRequest;
    use proptest::prelude::*;

    fn to_chat(request: Value) -> Result<Value, GatewayError> {
        responses_request_to_chat(request.to_string().as_bytes())
            .map(|bytes| serde_json::from_slice(&bytes).unwrap())
    }

    /// What Codex CLI sends (0.169): a turn that ran a command, with its
    /// reasoning passed back and tools the Responses API runs itself.
    fn codex_request() -> Value {
        json!({
            "model": "openai/gpt-5-codex", "instructions": "You are Codex.",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: read-only."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "ls"}], "encrypted_content": "gAAA"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
                {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "exec_command", "arguments": "{\"cmd\":\"pwd\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "Cargo.toml"},
                {"type": "function_call_output", "call_id": "call_2", "output": "/work"},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "And this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "high"},
                    {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"},
                ]},
            ],
            "tools": [
                {"type": "function", "name": "exec_command", "description": "Runs a command",
                 "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": false},
                {"type": "web_search"},
                {"type": "namespace", "name": "mcp__docs", "tools": []},
                {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                {"type": "local_shell"},
            ],
            "tool_choice": "auto", "parallel_tool_calls": true,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": false, "stream": true, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "session-1", "text": {"verbosity": "low"},
        })
    }

    #[test]
    fn a_codex_request_becomes_a_chat_request() {
        let chat = to_chat(codex_request()).unwrap();
        assert_eq!(
            chat,
            json!({
                "model": "openai/gpt-5-codex",
                "stream": true, "stream_options": {"include_usage": true},
                "reasoning_effort": "medium",
                "messages": [
                    {"role": "system", "content": "You are Codex."},
                    {"role": "system", "content": "Sandbox: read-only."},
                    {"role": "user", "content": "List the files."},
                    // The reasoning is dropped; the turn's calls join its text.
                    {"role": "assistant", "content": "Listing.", "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"pwd\"}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "Cargo.toml"},
                    {"role": "tool", "tool_call_id": "call_2", "content": "/work"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "And this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "high"}},
                        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"}},
                    ]},
                ],
                // Only the function tool: the others run on the Responses API's side.
                "tools": [{"type": "function", "function": {"name": "exec_command", "description": "Runs a command",
                    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": false}}],
                "tool_choice": "auto", "parallel_tool_calls": true,
            })
        );
        let parsed = ChatRequest::parse(chat.to_string().as_bytes()).unwrap();
        assert!(parsed.stream_usage_requested);
    }

    #[test]
    fn the_options_map_to_chat() {
        let chat = to_chat(json!({
            "model": "a/b", "input": "Hi", "max_output_tokens": 300, "temperature": 0.3, "top_p": 0.9,
            "user": "u-1", "metadata": {"k": "v"}, "service_tier": "flex", "truncation": "auto",
            "text": {"format": {"type": "json_schema", "name": "answer", "strict": true,
                "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}}},
            "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": "f"},
        }))
        .unwrap();
        assert_eq!(
            chat,
            json!({
                "model": "a/b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 300,
                "temperature": 0.3, "top_p": 0.9, "user": "u-1",
                "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "strict": true,
                    "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}}},
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            })
        );
        ChatRequest::parse(chat.to_string().as_bytes()).unwrap();
        let json_mode = to_chat(json!({"model": "a/b", "input": "Hi", "text": {"format": {"type": "json_object"}},
            "tools": [{"type": "web_search"}], "tool_choice": "required", "parallel_tool_calls": false}))
        .unwrap();
        // No function tool left: no tools, no choice, no parallel flag.
        assert_eq!(
            json_mode,
            json!({"model": "a/b", "messages": [{"role": "user", "content": "Hi"}],
                   "response_format": {"type": "json_object"}})
        );
    }

    #[test]
    fn custom_tool_calls_in_the_conversation_pass_as_calls() {
        let chat = to_chat(json!({"model": "a/b", "input": [
            {"type": "message", "role": "user", "content": "Patch it"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "Done"}]},
        ]}))
        .unwrap();
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "user", "content": "Patch it"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "apply_patch", "arguments": "{\"input\":\"*** Begin Patch\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Done"},
            ])
        );
    }

    #[test]
    fn what_chat_cannot_say_is_a_400_naming_the_field() {
        let user = |content: Value| json!({"type": "message", "role": "user", "content": content});
        for (request, param) in [
            (
                json!({"model": "a/b", "input": [user(json!([{"type": "input_image", "file_id": "file-1"}]))]}),
                "input[0].content[0].file_id",
            ),
            (
                json!({"model": "a/b", "input": [user(json!([{"type": "input_file", "file_url": "https://e.com/a.pdf"}]))]}),
                "input[0].content[0].file_url",
            ),
            (
                json!({"model": "a/b", "input": [user(json!("Hi")), {"type": "item_reference", "id": "msg_1"}]}),
                "input[1].type",
            ),
            (
                json!({"model": "a/b", "input": [{"type": "function_call_output", "call_id": "c",
                    "output": [{"type": "input_image", "image_url": "https://e.com/a.png"}]}]}),
                "input[0].output[0].type",
            ),
            (
                json!({"model": "a/b", "input": [{"type": "message", "role": "system",
                    "content": [{"type": "input_image", "image_url": "https://e.com/a.png"}]}]}),
                "input[0].content[0].type",
            ),
            (
                json!({"model": "a/b", "input": "Hi", "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}],
                    "tool_choice": {"type": "web_search"}}),
                "tool_choice.type",
            ),
            (
                json!({"model": "a/b", "input": "Hi", "tool_choice": {"type": "function", "name": "f"}}),
                "tool_choice.name",
            ),
            (
                json!({"model": "a/b", "input": [{"type": "reasoning", "summary": []}]}),
                "input",
            ),
        ] {
            let error = to_chat(request.clone()).unwrap_err();
            assert_eq!(error.status(), 400, "{request}: {}", error.message());
            assert_eq!(error.metadata()["param"], param, "{}", error.message());
        }
        // The parser's own refusals pass as they are.
        let error = to_chat(json!({"model": "a/b", "input": "Hi", "store": true})).unwrap_err();
        assert_eq!(error.metadata()["param"], "store");
    }

    const MODELS: [&str; 3] = ["openai/gpt-5-codex", "meta/llama-3:free", "a/b"];

    fn text() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 .,!?\"\\\\é\n]{1,24}"
    }

    fn user_part() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(|text| json!({"type": "input_text", "text": text})),
            "[A-Za-z0-9+/]{4,12}".prop_map(|data| json!({"type": "input_image",
                "image_url": format!("data:image/png;base64,{data}")})),
            "[a-z]{1,8}".prop_map(|name| json!({"type": "input_image", "detail": "low",
                "image_url": format!("https://example.com/{name}.png")})),
            "[A-Za-z0-9+/]{4,12}"
                .prop_map(|data| json!({"type": "input_file", "filename": "a.pdf",
                "file_data": format!("data:application/pdf;base64,{data}")})),
        ]
    }

    fn item() -> impl Strategy<Value = Value> {
        let role = prop::sample::select(&["user", "developer", "system", "assistant"][..]);
        prop_oneof![
            (role.clone(), text()).prop_map(|(role, text)| json!({"role": role, "content": text})),
            prop::collection::vec(user_part(), 1..4)
                .prop_map(|parts| json!({"type": "message", "role": "user", "content": parts})),
            (role, text()).prop_map(|(role, text)| {
                let kind = if role == "assistant" { "output_text" } else { "input_text" };
                json!({"type": "message", "role": role, "content": [{"type": kind, "text": text}]})
            }),
            ("[a-z0-9_]{1,8}", "[a-z_]{1,8}", text()).prop_map(|(id, name, arguments)| json!(
                {"type": "function_call", "call_id": id, "name": name, "arguments": arguments})),
            ("[a-z0-9_]{1,8}", text()).prop_map(|(id, output)| json!(
                {"type": "function_call_output", "call_id": id, "output": output})),
            ("[a-z0-9_]{1,8}", "[a-z_]{1,8}", text()).prop_map(|(id, name, input)| json!(
                {"type": "custom_tool_call", "call_id": id, "name": name, "input": input})),
            text().prop_map(|summary| json!({"type": "reasoning",
                "summary": [{"type": "summary_text", "text": summary}], "encrypted_content": "gAAA"})),
        ]
    }

    fn tool() -> impl Strategy<Value = Value> {
        prop_oneof![
            ("[a-z_]{1,8}", prop::option::of(text())).prop_map(|(name, description)| json!(
                {"type": "function", "name": name, "description": description,
                 "parameters": {"type": "object"}, "strict": false})),
            Just(json!({"type": "web_search"})),
            Just(json!({"type": "local_shell"})),
            "[a-z_]{1,8}".prop_map(|name| json!({"type": "custom", "name": name})),
            "[a-z_]{1,8}".prop_map(|name| json!({"type": "namespace", "name": name, "tools": []})),
        ]
    }

    prop_compose! {
        fn responses_request()(
            model in prop::sample::select(&MODELS[..]),
            first in text(),
            items in prop::collection::vec(item(), 0..8),
            text_input in any::<bool>(),
            instructions in prop::option::of(text()),
            max_output_tokens in prop::option::of(1u64..200_000),
            stream in any::<bool>(),
            temperature in prop::option::of(0.0f64..=2.0),
            effort in prop::option::of(prop::sample::select(&["minimal", "low", "medium", "high"][..])),
            tools in prop::collection::vec(tool(), 0..5),
            choice in prop::option::of(prop::sample::select(&["auto", "none", "required"][..])),
        ) -> Value {
            let mut all = vec![json!({"type": "message", "role": "user", "content": first.clone()})];
            all.extend(items);
            let input = if text_input { json!(first) } else { json!(all) };
            let mut request = json!({"model": model, "input": input, "stream": stream, "store": false});
            if let Some(instructions) = instructions { request["instructions"] = instructions.into(); }
            if let Some(max) = max_output_tokens { request["max_output_tokens"] = max.into(); }
            if let Some(temperature) = temperature { request["temperature"] = temperature.into(); }
            if let Some(effort) = effort { request["reasoning"] = json!({"effort": effort}); }
            if !tools.is_empty() { request["tools"] = tools.into(); }
            if let Some(choice) = choice { request["tool_choice"] = choice.into(); }
            request
        }
    }

    fn calls_in(request: &ResponsesRequest) -> usize {
        match &request.input {
            ResponsesInput::Text(_) => 0,
            ResponsesInput::Items(items) => items
                .iter()
                .filter(|item| {
                    matches!(
                        item.kind,
                        ItemKind::FunctionCall { .. } | ItemKind::CustomToolCall { .. }
                    )
                })
                .count(),
        }
    }

    fn function_tools_in(request: &ResponsesRequest) -> usize {
        request
            .tools
            .iter()
            .flatten()
            .filter(|tool| matches!(tool.kind, ResponsesToolKind::Function { .. }))
            .count()
    }

    proptest! {
        #[test]
        fn a_valid_responses_request_translates_to_a_chat_request_the_gateway_accepts(
            request in responses_request(),
        ) {
            let body = request.to_string();
            let parsed = ResponsesRequest::parse(body.as_bytes()).unwrap();
            let chat = responses_request_to_chat(body.as_bytes()).unwrap();
            let chat = ChatRequest::parse(&chat).unwrap();
            prop_assert_eq!(&chat.model, &parsed.model);
            prop_assert_eq!(chat.stream, parsed.stream);
            prop_assert_eq!(chat.stream_usage_requested, parsed.stream);
            prop_assert_eq!(chat.max_tokens, parsed.max_output_tokens);
            prop_assert_eq!(chat.temperature, parsed.temperature);
            let chat_calls: usize = chat
                .messages
                .iter()
                .filter_map(|message| message.extra.get("tool_calls").and_then(Value::as_array))
                .map(Vec::len)
                .sum();
            prop_assert_eq!(chat_calls, calls_in(&parsed));
            prop_assert_eq!(chat.tools.map_or(0, |tools| tools.len()), function_tools_in(&parsed));
        }

        #[test]
        fn arbitrary_json_never_panics(body in "[\\[\\]{}\",:a-z0-9 ]{0,64}") {
            let _ = responses_request_to_chat(body.as_bytes());
        }
    }
}
