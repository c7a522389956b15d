//! The chat-completions request: parsed once, validated, kept in the
//! request's [`RequestContext`](super::RequestContext) for the layers
//! after [`BodyLimit`](crate::body::BodyLimit).

use std::fmt;

use serde_json::{Map, Value};

use crate::error::GatewayError;
use crate::json_input::{
    bad_request, integer_at_least, invalid_parameter, number_in, request_body_fields,
    take_messages, take_model, take_stream, wrong_type,
};
use crate::model_id::{ModelId, ModelNames};

/// A message author's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `system`
    System,
    /// `developer` (newer OpenAI clients' name for system instructions)
    Developer,
    /// `user`
    User,
    /// `assistant`
    Assistant,
    /// `tool`: a tool call's result
    Tool,
    /// `function`: the legacy form of `tool`
    Function,
}

impl Role {
    const ALL: [Role; 6] = [
        Role::System,
        Role::Developer,
        Role::User,
        Role::Assistant,
        Role::Tool,
        Role::Function,
    ];

    /// The role's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
        }
    }

    fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == name)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A message's content.
#[derive(Clone, Debug, PartialEq)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", …}`, `{"type": "image_url", …}`, …).
    Parts(Vec<Value>),
}

impl MessageContent {
    /// Characters of text in the content (text parts only), a measure of
    /// the prompt's size for cost estimates.
    pub fn text_chars(&self) -> usize {
        match self {
            MessageContent::Text(text) => text.chars().count(),
            MessageContent::Parts(parts) => parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .map(|text| text.chars().count())
                .sum(),
        }
    }
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// What it says; `None` only for an assistant message that carries
    /// `tool_calls` or `function_call` instead.
    pub content: Option<MessageContent>,
    /// Every other field (`name`, `tool_calls`, `tool_call_id`, …).
    pub extra: Map<String, Value>,
}

/// A parsed and validated chat-completions request.
///
/// The request's bytes reach the upstream unchanged; this is the gateway's
/// reading of them, for its own layers.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The model id, as the body names it (a bare id or an alias as the
    /// client sent it).
    pub model: String,
    /// The model the gateway chose: `model` parsed, or what the
    /// [`ModelNames`] of `BodyLimit` made of a
    /// bare id or alias. Prices, limits, quotas and records use this one.
    pub model_id: ModelId,
    /// The conversation; never empty.
    pub messages: Vec<ChatMessage>,
    /// Whether the response is streamed (SSE).
    pub stream: bool,
    /// The larger of `max_completion_tokens` and `max_tokens`: the most
    /// completion tokens the upstream may generate, whichever of the two
    /// it obeys. `None` when the client set neither.
    pub max_tokens: Option<u64>,
    /// Whether the client asked for usage in a stream
    /// (`stream_options.include_usage` is true).
    pub stream_usage_requested: bool,
    /// Sampling temperature, 0 to 2.
    pub temperature: Option<f64>,
    /// Nucleus sampling, 0 to 1.
    pub top_p: Option<f64>,
    /// Number of choices, at least 1.
    pub n: Option<u64>,
    /// Tool definitions.
    pub tools: Option<Vec<Value>>,
    /// The requested response format.
    pub response_format: Option<Value>,
    /// Every other top-level field, kept as sent.
    pub extra: Map<String, Value>,
}

impl ChatRequest {
    /// Parses and validates a chat-completions body.
    ///
    /// 400 `invalid_request_error` for invalid JSON (with line and column),
    /// a body that is not an object, a missing `model` or `messages`, an
    /// empty `messages`, a null `content`, an unknown role or a strict
    /// schema that is not strict; 422 `invalid_parameter` for any field of
    /// the wrong type (`"model": 5`, `"messages": "hi"`, `"stream": "yes"`)
    /// or out of range, naming it in the message and in `metadata.param`.
    ///
    /// ```
    /// use modelgate::body::ChatRequest;
    ///
    /// let request = ChatRequest::parse(br#"{"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
    /// assert_eq!(request.model, "openai/gpt-4o");
    ///
    /// let error = ChatRequest::parse(br#"{"model": "p/m", "messages": [], "temperature": 3}"#).unwrap_err();
    /// assert_eq!(error.status(), 400);
    /// assert!(error.message().contains("messages"));
    /// ```
    pub fn parse(body: &[u8]) -> Result<ChatRequest, GatewayError> {
        Self::parse_named(body, &ModelNames::new())
    }

    /// As [`ChatRequest::parse`], a bare id or alias resolved by `names`.
    pub(crate) fn parse_named(
        body: &[u8],
        names: &ModelNames,
    ) -> Result<ChatRequest, GatewayError> {
        let mut fields = request_body_fields(body)?;
        let model = take_model(&mut fields)?;
        let messages = take_messages(&mut fields)?
            .into_iter()
            .enumerate()
            .map(|(index, message)| parse_message(index, message))
            .collect::<Result<Vec<_>, _>>()?;
        let stream = take_stream(&mut fields)?;
        let max_completion_tokens = positive_integer(&mut fields, "max_completion_tokens")?;
        let max_tokens = positive_integer(&mut fields, "max_tokens")?;
        let stream_usage_requested = stream_usage_requested(&fields)?;
        let temperature = number_taken(&mut fields, "temperature", 0.0, 2.0)?;
        let top_p = number_taken(&mut fields, "top_p", 0.0, 1.0)?;
        let n = positive_integer(&mut fields, "n")?;
        number_in_kept(&fields, "presence_penalty", -2.0, 2.0)?;
        number_in_kept(&fields, "frequency_penalty", -2.0, 2.0)?;
        integer_in_kept(&fields, "top_logprobs", 0, 20)?;
        bool_kept(&fields, "logprobs")?;
        integer_in_kept(&fields, "seed", i64::MIN, i64::MAX)?;
        check_stop(&fields)?;
        let tools = parse_tools(fields.remove("tools"))?;
        let response_format = parse_response_format(fields.remove("response_format"))?;
        // Checked last, so each other field's error reads the same whatever
        // the model; the limit layers need the parsed id.
        let model_id = names.resolve(&model)?;
        Ok(ChatRequest {
            model,
            model_id,
            messages,
            stream,
            // `None` is less than any bound: one field alone is that field.
            max_tokens: max_completion_tokens.max(max_tokens),
            stream_usage_requested,
            temperature,
            top_p,
            n,
            tools,
            response_format,
            extra: fields,
        })
    }

    /// Characters of text across all messages: the prompt's size.
    pub fn prompt_chars(&self) -> usize {
        self.messages
            .iter()
            .filter_map(|message| message.content.as_ref())
            .map(MessageContent::text_chars)
            .sum()
    }
}

/// `value` when it is of the `expected` type (its words, and the check):
/// 400 `invalid_request_error` with `missing` when absent or null, 422
/// when of another type; both name `param`.
fn required<'v>(
    value: Option<&'v Value>,
    param: &str,
    (expected, is_expected): (&str, fn(&Value) -> bool),
    missing: &str,
) -> Result<&'v Value, GatewayError> {
    match value {
        Some(value) if is_expected(value) => Ok(value),
        None | Some(Value::Null) => Err(bad_request(param, format!("`{param}` {missing}"))),
        Some(other) => Err(wrong_type(param, expected, other)),
    }
}

fn parse_message(index: usize, message: Value) -> Result<ChatMessage, GatewayError> {
    // Formatted only on the way to an error: valid messages allocate nothing here.
    let at = MessageAt(index);
    let Value::Object(mut fields) = message else {
        return Err(wrong_type(
            &at.to_string(),
            "an object with `role` and `content`",
            &message,
        ));
    };
    let role = match fields.remove("role") {
        Some(Value::String(name)) => Role::parse(&name).ok_or_else(|| {
            bad_request(&format!("{at}.role"), format!(
                "`{at}.role` is {name:?}, which is not a role; use one of system, developer, user, assistant, tool, function"
            ))
        })?,
        None | Some(Value::Null) => {
            return Err(bad_request(&format!("{at}.role"), format!("`{at}.role` is required")))
        }
        Some(other) => return Err(wrong_type(&format!("{at}.role"), "a string", &other)),
    };
    // OpenAI clients send an assistant turn that called tools with
    // `content: null`; every other null content is refused.
    let calls_tools = role == Role::Assistant
        && (matches!(fields.get("tool_calls"), Some(Value::Array(calls)) if !calls.is_empty())
            || matches!(fields.get("function_call"), Some(Value::Object(_))));
    let content = match fields.remove("content") {
        Some(Value::String(text)) => Some(MessageContent::Text(text)),
        Some(Value::Array(parts)) => Some(MessageContent::Parts(check_parts(&at, parts)?)),
        None | Some(Value::Null) if calls_tools => None,
        Some(Value::Null) => {
            return Err(bad_request(
                &format!("{at}.content"),
                format!("`{at}.content` must not be null: send a string (use \"\" for nothing)"),
            ));
        }
        None => {
            return Err(bad_request(
                &format!("{at}.content"),
                format!("`{at}.content` is required"),
            ));
        }
        Some(other) => {
            return Err(wrong_type(
                &format!("{at}.content"),
                "a string or an array of content parts",
                &other,
            ));
        }
    };
    if role == Role::Tool {
        required(
            fields.get("tool_call_id"),
            &format!("{at}.tool_call_id"),
            ("a string", Value::is_string),
            "is required for a tool message",
        )?;
    }
    Ok(ChatMessage {
        role,
        content,
        extra: fields,
    })
}

/// `messages[i]`, for messages and field paths in errors.
#[derive(Clone, Copy)]
struct MessageAt(usize);

impl fmt::Display for MessageAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "messages[{}]", self.0)
    }
}

fn check_parts(at: &MessageAt, parts: Vec<Value>) -> Result<Vec<Value>, GatewayError> {
    for (index, part) in parts.iter().enumerate() {
        let param = format!("{at}.content[{index}]");
        if !part.is_object() {
            return Err(wrong_type(&param, "an object with a string `type`", part));
        }
        required(
            part.get("type"),
            &format!("{param}.type"),
            ("a string", Value::is_string),
            "is required: each content part is an object with a string `type`",
        )?;
    }
    Ok(parts)
}

/// Takes `param` from `fields` as an integer of at least 1.
fn positive_integer(
    fields: &mut Map<String, Value>,
    param: &str,
) -> Result<Option<u64>, GatewayError> {
    integer_at_least(fields.remove(param).as_ref(), param, 1)
}

/// Takes `param` from `fields` as a number from `min` to `max`.
fn number_taken(
    fields: &mut Map<String, Value>,
    param: &str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, GatewayError> {
    number_in(fields.remove(param).as_ref(), param, min, max)
}

/// Checks `param` in `fields` as a number from `min` to `max`, leaving it
/// there to go upstream.
fn number_in_kept(
    fields: &Map<String, Value>,
    param: &str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, GatewayError> {
    number_in(fields.get(param), param, min, max)
}

fn integer_in_kept(
    fields: &Map<String, Value>,
    param: &str,
    min: i64,
    max: i64,
) -> Result<(), GatewayError> {
    match fields.get(param) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Number(number)) => match number.as_i64() {
            Some(value) if (min..=max).contains(&value) => Ok(()),
            _ if min == i64::MIN => Err(invalid_parameter(
                param,
                format!("`{param}` must be an integer, not {number}"),
            )),
            _ => Err(invalid_parameter(
                param,
                format!("`{param}` must be an integer from {min} to {max}, not {number}"),
            )),
        },
        Some(other) => Err(wrong_type(param, "an integer", other)),
    }
}

fn bool_kept(fields: &Map<String, Value>, param: &str) -> Result<(), GatewayError> {
    match fields.get(param) {
        None | Some(Value::Null) | Some(Value::Bool(_)) => Ok(()),
        Some(other) => Err(wrong_type(param, "a boolean", other)),
    }
}

/// `stream_options.include_usage`, checked; `stream_options` stays in
/// `extra` and goes upstream as sent.
fn stream_usage_requested(fields: &Map<String, Value>) -> Result<bool, GatewayError> {
    let options = match fields.get("stream_options") {
        None | Some(Value::Null) => return Ok(false),
        Some(Value::Object(options)) => options,
        Some(other) => return Err(wrong_type("stream_options", "an object", other)),
    };
    match options.get("include_usage") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(include)) => Ok(*include),
        Some(other) => Err(wrong_type(
            "stream_options.include_usage",
            "a boolean",
            other,
        )),
    }
}

fn check_stop(fields: &Map<String, Value>) -> Result<(), GatewayError> {
    match fields.get("stop") {
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
        // How many stop sequences a model takes is the upstream's to say.
        Some(Value::Array(stops)) if stops.iter().all(Value::is_string) => Ok(()),
        Some(other) => Err(wrong_type("stop", "a string or an array of strings", other)),
    }
}

fn parse_tools(tools: Option<Value>) -> Result<Option<Vec<Value>>, GatewayError> {
    let tools = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(tools)) => tools,
        Some(other) => return Err(wrong_type("tools", "an array", &other)),
    };
    for (index, tool) in tools.iter().enumerate() {
        // Only function tools have a shape to check; other tool types
        // (custom tools, provider-side tools) pass to the upstream as sent.
        let kind = tool
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("function");
        if kind != "function" {
            continue;
        }
        let at = format!("tools[{index}]");
        let function = required(
            tool.get("function"),
            &format!("{at}.function"),
            ("an object with `name` and `parameters`", Value::is_object),
            "is required: an object with `name` and `parameters`",
        )?;
        let name_param = format!("{at}.function.name");
        let name = required(
            function.get("name"),
            &name_param,
            ("a string", Value::is_string),
            "is required",
        )?;
        if name.as_str().is_some_and(str::is_empty) {
            return Err(bad_request(
                &name_param,
                format!("`{name_param}` is required"),
            ));
        }
        if function.get("strict") == Some(&Value::Bool(true))
            && let Some(schema) = function.get("parameters")
        {
            check_strict_schema(schema, &format!("{at}.function.parameters"))?;
        }
    }
    Ok(Some(tools))
}

fn parse_response_format(format: Option<Value>) -> Result<Option<Value>, GatewayError> {
    let format = match format {
        None | Some(Value::Null) => return Ok(None),
        Some(format @ Value::Object(_)) => format,
        Some(other) => return Err(wrong_type("response_format", "an object", &other)),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text" | "json_object") => {}
        Some("json_schema") => {
            let json_schema = required(
                format.get("json_schema"),
                "response_format.json_schema",
                ("an object", Value::is_object),
                "is required when `response_format.type` is \"json_schema\"",
            )?;
            if json_schema.get("strict") == Some(&Value::Bool(true))
                && let Some(schema) = json_schema.get("schema")
            {
                check_strict_schema(schema, "response_format.json_schema.schema")?;
            }
        }
        _ => {
            return Err(invalid_parameter(
                "response_format.type",
                "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\""
                    .to_owned(),
            ));
        }
    }
    Ok(Some(format))
}

/// Strict mode: every object schema, at every depth, lists all of its
/// `properties` in `required` and sets `additionalProperties` to false.
fn check_strict_schema(schema: &Value, path: &str) -> Result<(), GatewayError> {
    let Value::Object(schema) = schema else {
        return Ok(());
    };
    let properties = match schema.get("properties") {
        None => None,
        Some(Value::Object(properties)) => Some(properties),
        Some(_) => {
            return Err(bad_request(
                path,
                format!("strict schema at `{path}`: `properties` must be an object"),
            ));
        }
    };
    let is_object = schema.get("type").is_some_and(|kind| {
        kind == "object"
            || kind
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "object"))
    });
    let strict_error =
        |reason: String| bad_request(path, format!("strict schema at `{path}`: {reason}"));
    if is_object || properties.is_some() {
        if schema.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err(strict_error(
                "`additionalProperties` must be false in strict mode".to_owned(),
            ));
        }
        let required: Vec<&str> = match schema.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            Some(_) => {
                return Err(strict_error(
                    "`required` must be an array of names".to_owned(),
                ));
            }
        };
        if let Some(properties) = properties {
            let mut missing: Vec<&str> = properties
                .keys()
                .map(String::as_str)
                .filter(|name| !required.contains(name))
                .collect();
            if !missing.is_empty() {
                missing.sort_unstable();
                return Err(strict_error(format!(
                    "`required` must list every property; missing {}",
                    missing.join(", ")
                )));
            }
            if let Some(unknown) = required
                .iter()
                .find(|name| !properties.contains_key(**name))
            {
                return Err(strict_error(format!(
                    "`required` names {unknown}, which is not in `properties`"
                )));
            }
            for (name, property) in properties {
                check_strict_schema(property, &format!("{path}.properties.{name}"))?;
            }
        }
    }
    for keyword in ["items", "not", "additionalItems"] {
        if let Some(sub) = schema.get(keyword) {
            match sub {
                Value::Array(subs) => {
                    for (index, sub) in subs.iter().enumerate() {
                        check_strict_schema(sub, &format!("{path}.{keyword}[{index}]"))?;
                    }
                }
                sub => check_strict_schema(sub, &format!("{path}.{keyword}"))?,
            }
        }
    }
    for keyword in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(subs)) = schema.get(keyword) {
            for (index, sub) in subs.iter().enumerate() {
                check_strict_schema(sub, &format!("{path}.{keyword}[{index}]"))?;
            }
        }
    }
    for keyword in ["$defs", "definitions"] {
        if let Some(Value::Object(definitions)) = schema.get(keyword) {
            for (name, sub) in definitions {
                check_strict_schema(sub, &format!("{path}.{keyword}.{name}"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<ChatRequest, GatewayError> {
        ChatRequest::parse(value.to_string().as_bytes())
    }

    fn minimal() -> Value {
        json!({"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
    }

    fn with(field: &str, value: Value) -> Value {
        let mut request = minimal();
        request[field] = value;
        request
    }

    fn rejection(value: Value) -> (u16, String) {
        let error = parse(value).unwrap_err();
        (error.status().as_u16(), error.message().to_owned())
    }

    #[test]
    fn a_repeated_top_level_field_is_refused() {
        let error = ChatRequest::parse(
            br#"{"model": "a/b:free", "messages": [{"role": "user", "content": "x"}], "model": "a/b"}"#,
        )
        .unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(
            error.message().contains("duplicate field `model`"),
            "{}",
            error.message()
        );
        let error = ChatRequest::parse(b"[1, 2]").unwrap_err();
        assert!(
            error
                .message()
                .contains("must be a JSON object, not an array"),
            "{}",
            error.message()
        );
        let error = ChatRequest::parse(b"{\"model\": ").unwrap_err();
        assert!(
            error.message().contains("not valid JSON"),
            "{}",
            error.message()
        );
    }

    #[test]
    fn a_full_request_parses_and_keeps_unknown_fields() {
        let request = parse(json!({
            "model": "anthropic/claude-3.5-sonnet:free",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Héllo \"there\""}, {"type": "image_url", "image_url": {"url": "data:…"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "stream": true,
            "max_tokens": 100,
            "max_completion_tokens": 50,
            "temperature": 0.7,
            "top_p": 1,
            "n": 2,
            "stop": ["\n"],
            "seed": -3,
            "user": "u-1",
            "provider": {"order": ["x"]}
        }))
        .unwrap();
        assert_eq!(request.model, "anthropic/claude-3.5-sonnet:free");
        assert_eq!(request.messages.len(), 4);
        assert_eq!(request.messages[3].role, Role::Tool);
        assert_eq!(request.messages[2].content, None);
        assert!(request.stream);
        assert_eq!(
            request.max_tokens,
            Some(100),
            "the larger bound: the upstream may obey either"
        );
        assert!(!request.stream_usage_requested);
        assert_eq!(
            (request.temperature, request.top_p, request.n),
            (Some(0.7), Some(1.0), Some(2))
        );
        assert_eq!(request.extra["user"], "u-1");
        assert_eq!(request.extra["provider"]["order"][0], "x");
        assert_eq!(request.extra["stop"][0], "\n");
        assert_eq!(
            request.prompt_chars(),
            "Be brief.".len() + "Héllo \"there\"".chars().count() + 2
        );
    }

    #[test]
    fn invalid_json_names_line_and_column() {
        let error =
            ChatRequest::parse(b"{\n  \"model\": \"m\",\n  \"messages\": [,]\n}").unwrap_err();
        assert_eq!(error.status(), 400);
        assert_eq!(error.kind(), ErrorKind::InvalidRequest);
        assert!(
            error.message().contains("line 3, column 16"),
            "{}",
            error.message()
        );
        for body in [
            &b""[..],
            b"{",
            b"nul",
            b"{\"model\": \"\xff\"}",
            b"{\"a\":1}x",
        ] {
            assert_eq!(ChatRequest::parse(body).unwrap_err().status(), 400);
        }
    }

    #[test]
    fn model_and_messages_are_required_and_typed() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "`model` is required",
            ),
            (with("model", json!(null)), "`model` is required"),
            (with("model", json!("  ")), "`model` must not be empty"),
            (json!({"model": "p/m"}), "`messages` is required"),
            (with("messages", json!([])), "at least one message"),
            (
                with("messages", json!([{"content": "x"}])),
                "`messages[0].role` is required",
            ),
            (
                with("messages", json!([{"role": "bot", "content": "x"}])),
                "\"bot\", which is not a role",
            ),
            (
                with("messages", json!([{"role": "user", "content": null}])),
                "`messages[0].content` must not be null",
            ),
            (
                with("messages", json!([{"role": "user"}])),
                "`messages[0].content` is required",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"text": "x"}]}]),
                ),
                "`messages[0].content[0].type` is required: each content part is an object with a string `type`",
            ),
            (
                with("messages", json!([{"role": "assistant", "content": null}])),
                "must not be null",
            ),
            (
                with("messages", json!([{"role": "tool", "content": "x"}])),
                "`messages[0].tool_call_id` is required",
            ),
            (json!([1, 2]), "must be a JSON object, not an array"),
        ];
        for (request, expected) in cases {
            let (status, message) = rejection(request.clone());
            assert_eq!(status, 400, "{request}");
            assert!(message.contains(expected), "{request}: {message}");
        }
    }

    #[test]
    fn required_fields_of_the_wrong_type_get_422_naming_them() {
        let cases = [
            (
                with("model", json!(5)),
                "model",
                "`model` must be a string, not a number",
            ),
            (with("model", json!(["a/b"])), "model", "not an array"),
            (
                with("messages", json!("hi")),
                "messages",
                "`messages` must be an array, not a string",
            ),
            (
                with("messages", json!({"role": "user"})),
                "messages",
                "not an object",
            ),
            (
                with("messages", json!(["hi"])),
                "messages[0]",
                "`messages[0]` must be an object",
            ),
            (
                with("messages", json!([{"role": 1, "content": "x"}])),
                "messages[0].role",
                "`messages[0].role` must be a string, not a number",
            ),
            (
                with("messages", json!([{"role": "user", "content": 5}])),
                "messages[0].content",
                "must be a string or an array",
            ),
            (
                with("stream", json!("yes")),
                "stream",
                "`stream` must be a boolean",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "tool", "content": "x", "tool_call_id": 7}]),
                ),
                "messages[0].tool_call_id",
                "must be a string, not a number",
            ),
            (
                with("messages", json!([{"role": "user", "content": ["hi"]}])),
                "messages[0].content[0]",
                "must be an object with a string `type`, not a string",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": 1}]}]),
                ),
                "messages[0].content[0].type",
                "must be a string, not a number",
            ),
            (
                with("tools", json!([{"type": "function", "function": "f"}])),
                "tools[0].function",
                "not a string",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "function", "function": {"name": 5}}]),
                ),
                "tools[0].function.name",
                "must be a string, not a number",
            ),
            (
                with(
                    "response_format",
                    json!({"type": "json_schema", "json_schema": "s"}),
                ),
                "response_format.json_schema",
                "must be an object, not a string",
            ),
        ];
        for (request, param, expected) in cases {
            let error = parse(request.clone()).unwrap_err();
            assert_eq!(error.status(), 422, "{request}");
            assert_eq!(error.kind().type_str(), "invalid_parameter");
            assert_eq!(error.metadata()["param"], param, "{request}");
            assert!(
                error.message().contains(expected),
                "{request}: {}",
                error.message()
            );
        }
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any JSON value of another type in a typed field is a 422 naming
        /// that field; never a 400 or a panic.
        #[test]
        fn any_value_of_the_wrong_type_is_422(value in any_json(), field in 0usize..5) {
            let (name, right_type): (&str, fn(&Value) -> bool) = [
                ("model", Value::is_string as fn(&Value) -> bool),
                ("messages", Value::is_array),
                ("stream", Value::is_boolean),
                ("max_tokens", Value::is_number),
                ("temperature", Value::is_number),
            ][field];
            prop_assume!(!right_type(&value) && !value.is_null());
            let error = parse(with(name, value)).unwrap_err();
            prop_assert_eq!(error.status(), 422);
            prop_assert_eq!(&error.metadata()["param"], name);
        }
    }

    #[test]
    fn parameters_out_of_range_or_of_the_wrong_type_get_422_naming_them() {
        let cases = [
            ("temperature", json!(2.5)),
            ("temperature", json!(-0.1)),
            ("temperature", json!("hot")),
            ("top_p", json!(1.5)),
            ("max_tokens", json!(0)),
            ("max_tokens", json!(-5)),
            ("max_tokens", json!(1.5)),
            ("max_completion_tokens", json!(0)),
            ("n", json!(0)),
            ("stream", json!("yes")),
            ("presence_penalty", json!(3)),
            ("frequency_penalty", json!(-2.5)),
            ("top_logprobs", json!(21)),
            ("logprobs", json!(1)),
            ("seed", json!(1.5)),
            ("stop", json!(["a", 1])),
            ("stop", json!(3)),
            ("tools", json!({})),
            ("response_format", json!("json")),
            ("stream_options", json!(true)),
            ("stream_options", json!([])),
            (
                "stream_options.include_usage",
                json!({"include_usage": "yes"}),
            ),
            ("stream_options.include_usage", json!({"include_usage": 1})),
        ];
        for (param, value) in cases {
            let field = param.split('.').next().unwrap_or(param);
            let error = parse(with(field, value.clone())).unwrap_err();
            assert_eq!(error.status(), 422, "{param} = {value}");
            assert_eq!(error.kind().type_str(), "invalid_parameter");
            assert!(error.message().contains(param), "{}", error.message());
            assert_eq!(error.metadata()["param"], param);
        }
        let error = parse(with("response_format", json!({"type": "yaml"}))).unwrap_err();
        assert_eq!(error.status(), 422);
        // Edges are allowed.
        for (param, value) in [
            ("temperature", json!(0)),
            ("temperature", json!(2)),
            ("top_p", json!(0.0)),
            ("max_tokens", json!(1)),
        ] {
            assert!(
                parse(with(param, value.clone())).is_ok(),
                "{param} = {value}"
            );
        }
        // Nulls mean "not given".
        assert!(parse(with("temperature", json!(null))).is_ok());
    }

    fn strict_tool(parameters: Value) -> Value {
        with(
            "tools",
            json!([{"type": "function", "function": {"name": "lookup", "strict": true, "parameters": parameters}}]),
        )
    }

    #[test]
    fn strict_schemas_must_require_everything_and_forbid_extras_at_every_level() {
        let good = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}},
                    "required": ["street"],
                    "additionalProperties": false
                },
                "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"], "additionalProperties": false}}
            },
            "required": ["city", "address", "tags"],
            "additionalProperties": false
        });
        assert!(parse(strict_tool(good.clone())).is_ok());

        let mut missing_required = good.clone();
        missing_required["required"] = json!(["city", "tags"]);
        let error = parse(strict_tool(missing_required)).unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(
            error.message().contains("`tools[0].function.parameters`"),
            "{}",
            error.message()
        );
        assert!(
            error.message().contains("missing address"),
            "{}",
            error.message()
        );

        let mut nested_open = good.clone();
        nested_open["properties"]["address"]["additionalProperties"] = json!(true);
        let error = parse(strict_tool(nested_open)).unwrap_err();
        assert!(
            error
                .message()
                .contains("`tools[0].function.parameters.properties.address`"),
            "{}",
            error.message()
        );
        assert!(error.message().contains("additionalProperties"));

        let mut in_items = good.clone();
        in_items["properties"]["tags"]["items"]["required"] = json!([]);
        let error = parse(strict_tool(in_items)).unwrap_err();
        assert!(
            error.message().contains("properties.tags.items"),
            "{}",
            error.message()
        );

        let in_any_of = json!({"type": "object", "properties": {"v": {"anyOf": [{"type": "object", "properties": {"a": {}}}]}}, "required": ["v"], "additionalProperties": false});
        let error = parse(strict_tool(in_any_of)).unwrap_err();
        assert!(
            error.message().contains("properties.v.anyOf[0]"),
            "{}",
            error.message()
        );

        let in_defs = json!({"type": "object", "properties": {}, "additionalProperties": false, "$defs": {"node": {"type": "object", "properties": {"x": {}}, "additionalProperties": false}}});
        let error = parse(strict_tool(in_defs)).unwrap_err();
        assert!(
            error.message().contains("$defs.node"),
            "{}",
            error.message()
        );

        // Without strict mode the same schema is accepted.
        let mut lax = strict_tool(json!({"type": "object", "properties": {"a": {}}}));
        lax["tools"][0]["function"]["strict"] = json!(false);
        assert!(parse(lax).is_ok());

        let format = |schema: Value| {
            with(
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "out", "strict": true, "schema": schema}}),
            )
        };
        assert!(parse(format(good)).is_ok());
        let error = parse(format(
            json!({"type": "object", "properties": {"a": {}}, "required": ["a"]}),
        ))
        .unwrap_err();
        assert!(
            error
                .message()
                .contains("`response_format.json_schema.schema`"),
            "{}",
            error.message()
        );
        let error = parse(with("response_format", json!({"type": "json_schema"}))).unwrap_err();
        assert_eq!(error.status(), 400);
        let error = parse(with(
            "tools",
            json!([{"type": "function", "function": {"parameters": {}}}]),
        ))
        .unwrap_err();
        assert!(
            error
                .message()
                .contains("`tools[0].function.name` is required")
        );
    }

    #[test]
    fn review_edges_tools_tool_calls_and_strict_names() {
        // Other tool types pass as sent.
        let tools = json!([{"type": "web_search"}, {"type": "custom", "custom": {"name": "x"}}]);
        assert!(parse(with("tools", tools)).is_ok());
        // An empty tool_calls does not excuse a null content.
        let messages = json!([{"role": "assistant", "content": null, "tool_calls": []}]);
        assert_eq!(rejection(with("messages", messages)).0, 400);
        let unknown_required = json!({"type": "object", "properties": {"a": {}}, "required": ["a", "b"], "additionalProperties": false});
        let error = parse(strict_tool(unknown_required)).unwrap_err();
        assert!(
            error
                .message()
                .contains("names b, which is not in `properties`"),
            "{}",
            error.message()
        );
        let bad_properties =
            json!({"type": "object", "properties": [1], "additionalProperties": false});
        let error = parse(strict_tool(bad_properties)).unwrap_err();
        assert!(
            error.message().contains("`properties` must be an object"),
            "{}",
            error.message()
        );
    }

    #[test]
    fn the_completion_bound_is_the_larger_of_the_two_fields() {
        let bound = |fields: Value| {
            let mut request = minimal();
            for (name, value) in fields.as_object().unwrap() {
                request[name] = value.clone();
            }
            parse(request).unwrap().max_tokens
        };
        assert_eq!(bound(json!({})), None);
        assert_eq!(bound(json!({"max_tokens": 7})), Some(7));
        assert_eq!(bound(json!({"max_completion_tokens": 9})), Some(9));
        assert_eq!(
            bound(json!({"max_tokens": 7, "max_completion_tokens": 9})),
            Some(9)
        );
        assert_eq!(
            bound(json!({"max_tokens": 90, "max_completion_tokens": 9})),
            Some(90)
        );
        assert_eq!(
            bound(json!({"max_tokens": null, "max_completion_tokens": 9})),
            Some(9)
        );
    }

    #[test]
    fn a_stream_usage_request_is_read_from_stream_options() {
        let requested = |options: Value| {
            let request = parse(with("stream_options", options)).unwrap();
            // It goes upstream as sent.
            assert!(request.extra.contains_key("stream_options"));
            request.stream_usage_requested
        };
        assert!(!parse(minimal()).unwrap().stream_usage_requested);
        assert!(!requested(json!(null)));
        assert!(!requested(json!({})));
        assert!(!requested(json!({"include_usage": null})));
        assert!(!requested(json!({"include_usage": false})));
        assert!(requested(json!({"include_usage": true})));
        assert!(requested(
            json!({"include_usage": true, "continuous_usage_stats": false})
        ));
        let error = parse(with("stream_options", json!("usage"))).unwrap_err();
        assert_eq!(
            error.message(),
            "`stream_options` must be an object, not a string"
        );
    }

    #[test]
    fn non_ascii_and_escapes_are_decoded_exactly() {
        let body = r#"{"model":"p/m","messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"q\" \\ \n ü 😀"}]}"#;
        let request = ChatRequest::parse(body.as_bytes()).unwrap();
        let Some(MessageContent::Text(text)) = &request.messages[0].content else {
            panic!("text content")
        };
        assert_eq!(text, "café 😀 \"q\" \\ \n ü 😀");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ChatRequest::parse(&body);
        }

        #[test]
        fn arbitrary_json_values_never_panic(text in "[\\[\\]{}\":,0-9a-z ]{0,64}") {
            let _ = ChatRequest::parse(text.as_bytes());
        }

        #[test]
        fn valid_requests_parse_to_what_was_sent(
            model in "[a-z0-9-]{1,12}/[a-zA-Z0-9._-]{1,20}(:free)?",
            contents in proptest::collection::vec(any::<String>(), 1..5),
            temperature in proptest::option::of(0.0f64..=2.0),
            max_tokens in proptest::option::of(1u64..100_000),
            max_completion_tokens in proptest::option::of(1u64..100_000),
            include_usage in proptest::option::of(any::<bool>()),
            stream in any::<bool>(),
        ) {
            let messages: Vec<Value> = contents.iter().map(|content| json!({"role": "user", "content": content})).collect();
            let mut body = json!({"model": model, "messages": messages, "stream": stream});
            if let Some(temperature) = temperature { body["temperature"] = json!(temperature); }
            if let Some(max_tokens) = max_tokens { body["max_tokens"] = json!(max_tokens); }
            if let Some(bound) = max_completion_tokens { body["max_completion_tokens"] = json!(bound); }
            if let Some(include) = include_usage { body["stream_options"] = json!({"include_usage": include}); }
            let request = parse(body).unwrap();
            prop_assert_eq!(&request.model, &model);
            prop_assert_eq!(request.stream, stream);
            prop_assert_eq!(request.temperature, temperature);
            prop_assert_eq!(request.max_tokens, max_tokens.max(max_completion_tokens));
            prop_assert_eq!(request.stream_usage_requested, include_usage == Some(true));
            let texts: Vec<&str> = request.messages.iter().map(|message| match &message.content {
                Some(MessageContent::Text(text)) => text.as_str(),
                _ => "",
            }).collect();
            prop_assert_eq!(texts, contents.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }
}
