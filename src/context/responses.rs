//! OpenAI's Responses request (`POST /v1/responses`), stateless only:
//! parsed once, validated, and measured for a hold.
//!
//! [`ResponsesRequest::parse`] reads the body the Responses clients (Codex
//! CLI, the SDKs) send. The gateway keeps no responses, so what would need
//! one is refused with a 400 saying what to send instead: `store: true`,
//! `previous_response_id`, `conversation` and `background: true`. Every
//! request carries its whole conversation in `input` (Codex sends
//! `store: false` and the conversation, its reasoning passed back as
//! `encrypted_content`).
//!
//! Bad input is refused as [`ChatRequest::parse`](super::ChatRequest::parse)
//! and [`MessagesRequest::parse`](super::MessagesRequest::parse) refuse it:
//! 400 `invalid_request_error` for what is missing, empty or an unknown
//! value, 422 `invalid_parameter` for a wrong type or a number out of range,
//! each naming the field's path (`input[2].content[0].image_url`) in its
//! message and in `metadata.param`. Fields the gateway does not read are
//! kept as sent (`extra`, at every level), and items, content parts and
//! tools of types it does not know are kept too, so a newer client's
//! fields pass.
//!
//! What a hold needs is read from the parsed request:
//! [`ResponsesRequest::prompt_size`], [`ResponsesRequest::max_output_tokens`]
//! and [`ResponsesRequest::web_search_max_uses`].
//!
//! # Web searches
//!
//! Each web search has a fee, so a hold must bound the searches. The
//! Responses API has no per-tool `max_uses`; it has `max_tool_calls`, the
//! most calls of built-in tools (web searches among them) one response may
//! make. So the bound of a request with a web search tool is its
//! `max_tool_calls` when it sends one, and else
//! [`DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS`], which the gateway must then write
//! into the body as `max_tool_calls` before forwarding it
//! ([`ResponsesRequest::max_tool_calls_to_add`]), so that the upstream is
//! held to the number the hold covers. Codex sends a web search tool and no
//! `max_tool_calls`: it is served, with at most that many searches.
//!
//! ```
//! use modelgate::body::{
//!     DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS, ItemKind, ResponsesContent, ResponsesInput, ResponsesRequest,
//! };
//!
//! let body = br#"{
//!     "model": "openai/gpt-5-codex",
//!     "instructions": "You are Codex.",
//!     "input": [
//!         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
//!         {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
//!         {"type": "function_call_output", "call_id": "call_1", "output": "Cargo.toml"}
//!     ],
//!     "tools": [{"type": "web_search"}],
//!     "store": false,
//!     "stream": true
//! }"#;
//! let request = ResponsesRequest::parse(body).unwrap();
//! assert!(request.stream);
//! assert_eq!(request.max_output_tokens, None);
//! let ResponsesInput::Items(items) = &request.input else { unreachable!() };
//! assert!(matches!(&items[1].kind, ItemKind::FunctionCall { name, .. } if name == "exec_command"));
//! // No `max_tool_calls`: the gateway bounds the searches itself.
//! assert_eq!(request.web_search_max_uses(), Some(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS));
//! assert_eq!(request.max_tool_calls_to_add(), Some(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS));
//! let size = request.prompt_size();
//! assert!(size.measured_bytes >= ("You are Codex.".len() + "List the files.".len()) as u64);
//! assert_eq!(size.server_tool_count, 1);
//!
//! // The gateway keeps no responses.
//! let error = ResponsesRequest::parse(br#"{"model": "a/b", "input": "Hi", "store": true}"#).unwrap_err();
//! assert_eq!(error.status(), 400);
//! assert_eq!(error.metadata()["param"], "store");
//!
//! // An image part needs its image: 400, naming the path.
//! let error = ResponsesRequest::parse(br#"{"model": "a/b", "input": [{"role": "user", "content": [
//!     {"type": "input_image", "detail": "auto"}]}]}"#).unwrap_err();
//! assert_eq!(error.status(), 400);
//! assert_eq!(error.metadata()["param"], "input[0].content[0].image_url");
//! ```

use serde_json::{Map, Value};

use super::PromptSize;
use crate::error::GatewayError;
use crate::json_input::{
    At, bad_request, integer_at_least, json_bytes, number_in, request_body_fields, take_model,
    take_optional_bool, take_optional_string, take_stream, take_string, wrong_type,
};
use crate::model_id::{ModelId, ModelNames};

/// How many web searches a request with a web search tool and no
/// `max_tool_calls` may make: the gateway holds their fees and writes
/// `max_tool_calls` with this value into the body (see the module docs).
/// A turn of a coding agent rarely searches more often.
pub const DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS: u64 = 8;

/// A parsed and validated Responses request (`POST /v1/responses`).
///
/// The request's bytes reach the upstream as sent (but for a
/// `max_tool_calls` the gateway may add); this is the gateway's reading of
/// them, for its own layers. What a hold needs:
/// [`prompt_size`](ResponsesRequest::prompt_size), `max_output_tokens`
/// and [`web_search_max_uses`](ResponsesRequest::web_search_max_uses).
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesRequest {
    /// The model id, as the body names it (a bare id or an alias as the
    /// client sent it).
    pub model: String,
    /// The model the gateway chose: `model` parsed, or what the
    /// [`ModelNames`] of `BodyLimit` made of a
    /// bare id or alias. Prices, limits, quotas and records use this one.
    pub model_id: ModelId,
    /// The whole conversation.
    pub input: ResponsesInput,
    /// The system (or developer) instructions.
    pub instructions: Option<String>,
    /// Tool definitions.
    pub tools: Option<Vec<ResponsesTool>>,
    /// How the model must use the tools.
    pub tool_choice: Option<ResponsesToolChoice>,
    /// Whether the model may call several tools at once.
    pub parallel_tool_calls: Option<bool>,
    /// The most calls of built-in tools (web searches among them) the
    /// response may make.
    pub max_tool_calls: Option<u64>,
    /// The text output's options: its format and verbosity.
    pub text: Option<TextConfig>,
    /// Reasoning options: effort and summary.
    pub reasoning: Option<ReasoningConfig>,
    /// Whether the response is streamed (SSE).
    pub stream: bool,
    /// The most tokens the model may generate, reasoning included; at
    /// least 1. Codex sends none.
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature, 0 to 2.
    pub temperature: Option<f64>,
    /// Nucleus sampling, 0 to 1.
    pub top_p: Option<f64>,
    /// `metadata`: string values by key, as sent.
    pub metadata: Option<Map<String, Value>>,
    /// Extra output asked for (`reasoning.encrypted_content`, …), as sent.
    pub include: Option<Vec<String>>,
    /// The key the upstream's prompt cache groups requests by.
    pub prompt_cache_key: Option<String>,
    /// The end user's id.
    pub user: Option<String>,
    /// `truncation`: `auto` or `disabled`.
    pub truncation: Option<String>,
    /// `service_tier`: `auto`, `default`, `flex`, `priority` or `scale`.
    pub service_tier: Option<String>,
    /// `store`; never true (the gateway is stateless).
    pub store: Option<bool>,
    /// Every other top-level field, kept as sent.
    pub extra: Map<String, Value>,
}

/// The request's `input`: a string (one user message) or items.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponsesInput {
    /// One user message's text.
    Text(String),
    /// The conversation's items; never empty.
    Items(Vec<InputItem>),
}

/// One item of the conversation: its kind and what the kind carries, and
/// its other fields as sent (`id`, `status`, …).
#[derive(Clone, Debug, PartialEq)]
pub struct InputItem {
    /// The item's `type` and the fields the gateway reads.
    pub kind: ItemKind,
    /// Every other field of the item, kept as sent.
    pub extra: Map<String, Value>,
}

/// What an input item is.
#[derive(Clone, Debug, PartialEq)]
pub enum ItemKind {
    /// `message` (the type may be left out of a message): a role and its
    /// content.
    Message {
        /// Who wrote it.
        role: ResponsesRole,
        /// What it says.
        content: ResponsesContent,
    },
    /// `function_call`: the model's call of a function tool.
    FunctionCall {
        /// The call's id, which its output names.
        call_id: String,
        /// The tool's name.
        name: String,
        /// The arguments, a JSON text.
        arguments: String,
    },
    /// `function_call_output`: what a called function answered.
    FunctionCallOutput {
        /// The call answered.
        call_id: String,
        /// The answer: a string, or text, image and file parts.
        output: ResponsesContent,
    },
    /// `custom_tool_call`: the model's call of a custom (free-form) tool.
    CustomToolCall {
        /// The call's id, which its output names.
        call_id: String,
        /// The tool's name.
        name: String,
        /// The call's input, free text.
        input: String,
    },
    /// `custom_tool_call_output`: what a called custom tool answered.
    CustomToolCallOutput {
        /// The call answered.
        call_id: String,
        /// The answer: a string, or text, image and file parts.
        output: ResponsesContent,
    },
    /// `reasoning`: the model's earlier reasoning, passed back (its `id`
    /// and `content`, when sent, stay in `extra`).
    Reasoning {
        /// The reasoning's summary texts (`summary_text` parts).
        summary: Vec<String>,
        /// The reasoning itself, encrypted by the upstream
        /// (`include: ["reasoning.encrypted_content"]`).
        encrypted_content: Option<String>,
    },
    /// Any other type (`web_search_call`, `local_shell_call`,
    /// `item_reference`, newer ones), kept as sent with its fields in
    /// `extra`; what it costs in tokens is not in its bytes.
    Other {
        /// The item's `type`.
        kind: String,
    },
}

/// A message's author.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResponsesRole {
    /// `user`
    User,
    /// `assistant`
    Assistant,
    /// `system`
    System,
    /// `developer`
    Developer,
}

impl ResponsesRole {
    /// The role's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ResponsesRole::User => "user",
            ResponsesRole::Assistant => "assistant",
            ResponsesRole::System => "system",
            ResponsesRole::Developer => "developer",
        }
    }
}

/// A message's content (and a tool output's): a string, or content parts.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponsesContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One content part: its kind, and its other fields as sent (`detail`,
/// `filename`, `annotations`, `logprobs`, …).
#[derive(Clone, Debug, PartialEq)]
pub struct ContentPart {
    /// The part's `type` and the fields the gateway reads.
    pub kind: PartKind,
    /// Every other field of the part, kept as sent.
    pub extra: Map<String, Value>,
}

/// What a content part is.
#[derive(Clone, Debug, PartialEq)]
pub enum PartKind {
    /// `input_text`.
    InputText {
        /// The text.
        text: String,
    },
    /// `input_image`, by URL (a data URL included) or uploaded file.
    InputImage {
        /// Where the image is.
        source: ImageSource,
    },
    /// `input_file`: inline, by URL or uploaded.
    InputFile {
        /// Where the file is.
        source: FileSource,
    },
    /// `output_text`: what the model wrote earlier.
    OutputText {
        /// The text.
        text: String,
    },
    /// `refusal`: the model's earlier refusal.
    Refusal {
        /// Its text.
        refusal: String,
    },
    /// Any other type, kept as sent with its fields in `extra`; what it
    /// costs in tokens is not in its bytes.
    Other {
        /// The part's `type`.
        kind: String,
    },
}

/// Where an `input_image` is.
#[derive(Clone, Debug, PartialEq)]
pub enum ImageSource {
    /// `image_url`: fetched by the upstream, or a `data:` URL.
    Url(String),
    /// `file_id`: uploaded earlier through the Files API.
    FileId(String),
}

/// Where an `input_file` is.
#[derive(Clone, Debug, PartialEq)]
pub enum FileSource {
    /// `file_data`: the bytes inline (a data URL or base64).
    Data(String),
    /// `file_url`: fetched by the upstream.
    Url(String),
    /// `file_id`: uploaded earlier through the Files API.
    FileId(String),
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesTool {
    /// What kind of tool, and the fields the gateway reads.
    pub kind: ResponsesToolKind,
    /// Every other field, kept as sent.
    pub extra: Map<String, Value>,
}

/// What a tool is.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponsesToolKind {
    /// `function`: a tool the client runs (its `strict` stays in `extra`).
    Function {
        /// Its name.
        name: String,
        /// What it does, for the model.
        description: Option<String>,
        /// The JSON Schema of its arguments.
        parameters: Option<Map<String, Value>>,
    },
    /// The upstream's web search (any type that starts `web_search`:
    /// `web_search`, `web_search_preview`, their dated versions): each
    /// search has a fee, bounded by
    /// `max_tool_calls` (see the module docs).
    WebSearch {
        /// The type, as sent.
        tool_type: String,
    },
    /// Any other type (`custom`, `namespace`, `local_shell`,
    /// `file_search`, `mcp`, newer ones), kept as sent.
    Other {
        /// Its `type`.
        tool_type: String,
    },
}

impl ResponsesToolKind {
    /// Whether the upstream expands the tool's definition itself (every
    /// tool but those the client defines in full: `function` and
    /// `custom`), so that what it costs in tokens is not in its bytes.
    fn is_server_tool(&self) -> bool {
        match self {
            ResponsesToolKind::Function { .. } => false,
            ResponsesToolKind::WebSearch { .. } => true,
            ResponsesToolKind::Other { tool_type } => tool_type != "custom",
        }
    }
}

/// How the model must use the tools: `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponsesToolChoice {
    /// `"none"`, `"auto"` or `"required"`.
    Mode(String),
    /// An object naming a tool (`{"type": "function", "name": …}`) or a
    /// kind of tool (`{"type": "web_search_preview"}`, `allowed_tools`, …).
    Tool {
        /// Its `type`.
        tool_type: String,
        /// The tool's name, required for `function` and `custom`.
        name: Option<String>,
        /// Every other field, kept as sent.
        extra: Map<String, Value>,
    },
}

/// The text output's options: `text`.
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    /// `format`.
    pub format: Option<TextFormat>,
    /// `verbosity`: `low`, `medium` or `high`.
    pub verbosity: Option<String>,
    /// Every other field, kept as sent.
    pub extra: Map<String, Value>,
}

/// The text output's format: `text.format`.
#[derive(Clone, Debug, PartialEq)]
pub enum TextFormat {
    /// `{"type": "text"}`.
    Text,
    /// `{"type": "json_object"}`.
    JsonObject,
    /// `{"type": "json_schema", "name": …, "schema": {…}}` (its `strict`
    /// and `description` stay as sent in `extra`).
    JsonSchema {
        /// The format's name.
        name: String,
        /// The JSON Schema the output follows.
        schema: Map<String, Value>,
        /// Every other field, kept as sent.
        extra: Map<String, Value>,
    },
}

/// Reasoning options: `reasoning`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReasoningConfig {
    /// `effort`: `none`, `minimal`, `low`, `medium`, `high` or `xhigh`.
    pub effort: Option<String>,
    /// `summary`: `auto`, `concise`, `detailed` or `none`.
    pub summary: Option<String>,
    /// Every other field, kept as sent.
    pub extra: Map<String, Value>,
}

impl ResponsesRequest {
    /// Parses and validates the body of `POST /v1/responses`.
    ///
    /// 400 `invalid_request_error` for a body that is not a JSON object
    /// (with line and column when it is not JSON), a field named twice, a
    /// missing or empty `model` or `input`, a missing field of an item or a
    /// part, an unknown role, summary part, `tool_choice` mode, text format,
    /// verbosity, reasoning effort or summary, `truncation` or
    /// `service_tier`; and for what needs a stored response: `store: true`,
    /// `previous_response_id`, `conversation`, `background: true`. 422
    /// `invalid_parameter` for a field of the wrong type or out of range
    /// (`temperature` outside 0 to 2, `top_p` outside 0 to 1,
    /// `max_output_tokens` below 1). Each names its field's path in the
    /// message and in `metadata.param`.
    ///
    /// ```
    /// use modelgate::body::ResponsesRequest;
    ///
    /// let request = ResponsesRequest::parse(br#"{"model": "openai/gpt-5", "input": "Hi",
    ///     "max_output_tokens": 256}"#).unwrap();
    /// assert_eq!(request.max_output_tokens, Some(256));
    ///
    /// let error = ResponsesRequest::parse(br#"{"model": "a/b", "input": "Hi",
    ///     "previous_response_id": "resp_1"}"#).unwrap_err();
    /// assert_eq!(error.status(), 400);
    /// assert!(error.message().contains("stateless"));
    /// ```
    pub fn parse(body: &[u8]) -> Result<ResponsesRequest, GatewayError> {
        Self::parse_named(body, &ModelNames::new())
    }

    /// As [`ResponsesRequest::parse`], a bare id or alias resolved by `names`.
    pub(crate) fn parse_named(
        body: &[u8],
        names: &ModelNames,
    ) -> Result<ResponsesRequest, GatewayError> {
        let mut fields = request_body_fields(body)?;
        let model = take_model(&mut fields)?;
        let store = refuse_stored_state(&mut fields)?;
        let input = parse_input(fields.remove("input"))?;
        let top = At::Root;
        let instructions = match fields.remove("instructions") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text),
            Some(other) => return Err(At::Top("instructions").wrong_type("a string", &other)),
        };
        let tools = parse_tools(fields.remove("tools"))?;
        let tool_choice = parse_tool_choice(fields.remove("tool_choice"))?;
        let parallel_tool_calls = take_optional_bool(&mut fields, &top, "parallel_tool_calls")?;
        let max_tool_calls = integer_at_least(
            fields.remove("max_tool_calls").as_ref(),
            "max_tool_calls",
            0,
        )?;
        let text = parse_text(fields.remove("text"))?;
        let reasoning = parse_reasoning(fields.remove("reasoning"))?;
        let stream = take_stream(&mut fields)?;
        let max_output_tokens = integer_at_least(
            fields.remove("max_output_tokens").as_ref(),
            "max_output_tokens",
            1,
        )?;
        let temperature = number_in(
            fields.remove("temperature").as_ref(),
            "temperature",
            0.0,
            2.0,
        )?;
        let top_p = number_in(fields.remove("top_p").as_ref(), "top_p", 0.0, 1.0)?;
        let metadata = parse_metadata(fields.remove("metadata"))?;
        let include = parse_include(fields.remove("include"))?;
        let prompt_cache_key = take_optional_string(&mut fields, &top, "prompt_cache_key")?;
        let user = take_optional_string(&mut fields, &top, "user")?;
        let truncation = one_of(
            &At::Top("truncation"),
            fields.remove("truncation"),
            &["auto", "disabled"],
        )?;
        let service_tier = one_of(
            &At::Top("service_tier"),
            fields.remove("service_tier"),
            &["auto", "default", "flex", "priority", "scale"],
        )?;
        // Checked last, as chat does, so each other field's error reads the
        // same whatever the model; the limit layers need the parsed id.
        let model_id = names.resolve(&model)?;
        Ok(ResponsesRequest {
            model,
            model_id,
            input,
            instructions,
            tools,
            tool_choice,
            parallel_tool_calls,
            max_tool_calls,
            text,
            reasoning,
            stream,
            max_output_tokens,
            temperature,
            top_p,
            metadata,
            include,
            prompt_cache_key,
            user,
            truncation,
            service_tier,
            store,
            extra: fields,
        })
    }

    /// Whether the request offers a web search tool.
    pub fn has_web_search(&self) -> bool {
        self.tools
            .iter()
            .flatten()
            .any(|tool| matches!(tool.kind, ResponsesToolKind::WebSearch { .. }))
    }

    /// The most web searches the request may make (each has a fee): its
    /// `max_tool_calls` when sent, else [`DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS`]
    /// (which the gateway then sends: [`max_tool_calls_to_add`](Self::max_tool_calls_to_add));
    /// `None` without a web search tool.
    pub fn web_search_max_uses(&self) -> Option<u64> {
        self.has_web_search().then(|| {
            self.max_tool_calls
                .unwrap_or(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS)
        })
    }

    /// The `max_tool_calls` the gateway must write into the body before
    /// forwarding it, so that the upstream makes no more searches than the
    /// hold covers: [`DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS`] for a request with
    /// a web search tool and no `max_tool_calls`; `None` otherwise.
    pub fn max_tool_calls_to_add(&self) -> Option<u64> {
        match self.max_tool_calls {
            None if self.has_web_search() => Some(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS),
            _ => None,
        }
    }

    /// The prompt as the gateway can measure it, for its hold: see
    /// [`PromptSize`]. Measured at one byte a token: the instructions;
    /// each message's text, output text and refusals; function and custom
    /// tool calls (call id, name, arguments or input) and their outputs;
    /// reasoning summaries and encrypted reasoning; the items' and parts'
    /// other fields (as JSON); every tool's definition (as JSON); `text`
    /// (its format's schema is read by the model, as JSON); the request's
    /// other top-level fields (as JSON). Images and files are counted
    /// (`image_count`, `document_count`), as are items and parts of other
    /// types and a stored `prompt` template (`unmeasured_block_count`), tools
    /// but `function` and `custom` ones (`server_tool_count`), and the
    /// messages: the instructions and each item (`message_count`).
    /// `metadata`, `include`, `tool_choice`, `reasoning` and the sampling
    /// options are not read by the model and are not counted.
    pub fn prompt_size(&self) -> PromptSize {
        let mut size = PromptSize::default();
        if let Some(instructions) = &self.instructions {
            size.message_count += 1;
            size.add_bytes(instructions.len() as u64);
        }
        match &self.input {
            ResponsesInput::Text(text) => {
                size.message_count += 1;
                size.add_bytes(text.len() as u64);
            }
            ResponsesInput::Items(items) => {
                for item in items {
                    add_item(&mut size, item);
                }
            }
        }
        for tool in self.tools.iter().flatten() {
            if let ResponsesToolKind::Function {
                name,
                description,
                parameters,
            } = &tool.kind
            {
                size.add_bytes(name.len() as u64);
                size.add_bytes(description.as_ref().map_or(0, |text| text.len() as u64));
                size.add_bytes(parameters.as_ref().map_or(0, json_bytes));
            }
            if tool.kind.is_server_tool() {
                size.server_tool_count += 1;
            }
            size.add_extra(&tool.extra);
        }
        if let Some(text) = &self.text {
            if let Some(TextFormat::JsonSchema {
                name,
                schema,
                extra,
            }) = &text.format
            {
                size.add_bytes(name.len() as u64);
                size.add_bytes(json_bytes(schema));
                size.add_extra(extra);
            }
            size.add_extra(&text.extra);
        }
        // A stored prompt template expands upstream to text not in the body.
        if self
            .extra
            .get("prompt")
            .is_some_and(|prompt| !prompt.is_null())
        {
            size.unmeasured_block_count += 1;
        }
        size.add_extra(&self.extra);
        size
    }
}

fn add_item(size: &mut PromptSize, item: &InputItem) {
    size.message_count += 1;
    match &item.kind {
        ItemKind::Message { content, .. } => add_content(size, content),
        ItemKind::FunctionCall {
            call_id,
            name,
            arguments,
        } => size.add_bytes((call_id.len() + name.len() + arguments.len()) as u64),
        ItemKind::CustomToolCall {
            call_id,
            name,
            input,
        } => size.add_bytes((call_id.len() + name.len() + input.len()) as u64),
        ItemKind::FunctionCallOutput { call_id, output }
        | ItemKind::CustomToolCallOutput { call_id, output } => {
            size.add_bytes(call_id.len() as u64);
            add_content(size, output);
        }
        ItemKind::Reasoning {
            summary,
            encrypted_content,
        } => {
            size.add_bytes(summary.iter().map(|text| text.len() as u64).sum());
            // What the upstream decrypts is text of no more bytes than its
            // ciphertext's encoding.
            size.add_bytes(
                encrypted_content
                    .as_ref()
                    .map_or(0, |data| data.len() as u64),
            );
        }
        ItemKind::Other { .. } => {
            size.unmeasured_block_count += 1;
            // Its fields are not counted as text: the item is bounded as a
            // whole.
            return;
        }
    }
    size.add_extra(&item.extra);
}

fn add_content(size: &mut PromptSize, content: &ResponsesContent) {
    let parts = match content {
        ResponsesContent::Text(text) => return size.add_bytes(text.len() as u64),
        ResponsesContent::Parts(parts) => parts,
    };
    for part in parts {
        match &part.kind {
            PartKind::InputText { text } | PartKind::OutputText { text } => {
                size.add_bytes(text.len() as u64)
            }
            PartKind::Refusal { refusal } => size.add_bytes(refusal.len() as u64),
            PartKind::InputImage { .. } => size.image_count += 1,
            PartKind::InputFile { .. } => size.document_count += 1,
            PartKind::Other { .. } => {
                size.unmeasured_block_count += 1;
                continue;
            }
        }
        size.add_extra(&part.extra);
    }
}

/// Refuses what would need a response the gateway does not keep; gives
/// `store` otherwise.
fn refuse_stored_state(fields: &mut Map<String, Value>) -> Result<Option<bool>, GatewayError> {
    let top = At::Root;
    let store = take_optional_bool(fields, &top, "store")?;
    if store == Some(true) {
        return Err(bad_request(
            "store",
            "`store` is true, but this gateway is stateless: it keeps no responses to read back or continue from; send `store: false` and the whole conversation in `input`",
        ));
    }
    if fields
        .get("previous_response_id")
        .is_some_and(|id| !id.is_null())
    {
        return Err(bad_request(
            "previous_response_id",
            "`previous_response_id` continues a stored response, but this gateway is stateless and keeps none: send the whole conversation in `input` (earlier outputs as items, reasoning as `encrypted_content`) and leave `previous_response_id` out",
        ));
    }
    fields.remove("previous_response_id");
    if fields.get("conversation").is_some_and(|id| !id.is_null()) {
        return Err(bad_request(
            "conversation",
            "`conversation` continues a stored conversation, but this gateway is stateless and keeps none: send the whole conversation in `input` and leave `conversation` out",
        ));
    }
    fields.remove("conversation");
    if take_optional_bool(fields, &top, "background")? == Some(true) {
        return Err(bad_request(
            "background",
            "`background` is true, but a background response is fetched later from where it is stored, and this gateway is stateless: send `background: false` (with `stream: true` for a long answer)",
        ));
    }
    Ok(store)
}

fn parse_input(value: Option<Value>) -> Result<ResponsesInput, GatewayError> {
    let at = At::Top("input");
    let items = match value {
        None | Some(Value::Null) => {
            return Err(at.missing(
                "the whole conversation, as a string or an array of items (this gateway is stateless)",
            ));
        }
        Some(Value::String(text)) => return Ok(ResponsesInput::Text(text)),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(at.wrong_type("a string or an array of items", &other)),
    };
    if items.is_empty() {
        return Err(bad_request(
            "input",
            "`input` must contain at least one item",
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| parse_item(&at.index(index), item))
        .collect::<Result<_, _>>()
        .map(ResponsesInput::Items)
}

fn parse_item(at: &At<'_>, item: Value) -> Result<InputItem, GatewayError> {
    let Value::Object(mut fields) = item else {
        return Err(at.wrong_type(
            "an object such as {\"role\": \"user\", \"content\": \"Hi\"}",
            &item,
        ));
    };
    let kind = match fields.remove("type") {
        Some(Value::String(kind)) => kind,
        // A message may leave its type out.
        None | Some(Value::Null) if fields.contains_key("role") => "message".to_owned(),
        None | Some(Value::Null) => {
            return Err(at.field("type").missing(
                "each item is a message (with `role` and `content`) or an object with a string `type`",
            ));
        }
        Some(other) => return Err(at.field("type").wrong_type("a string", &other)),
    };
    let kind = match kind.as_str() {
        "message" => ItemKind::Message {
            role: parse_role(at, &mut fields)?,
            content: take_content(at, &mut fields, "content")?,
        },
        "function_call" => ItemKind::FunctionCall {
            call_id: take_string(&mut fields, at, "call_id")?,
            name: take_string(&mut fields, at, "name")?,
            arguments: take_string(&mut fields, at, "arguments")?,
        },
        "function_call_output" => ItemKind::FunctionCallOutput {
            call_id: take_string(&mut fields, at, "call_id")?,
            output: take_content(at, &mut fields, "output")?,
        },
        "custom_tool_call" => ItemKind::CustomToolCall {
            call_id: take_string(&mut fields, at, "call_id")?,
            name: take_string(&mut fields, at, "name")?,
            input: take_string(&mut fields, at, "input")?,
        },
        "custom_tool_call_output" => ItemKind::CustomToolCallOutput {
            call_id: take_string(&mut fields, at, "call_id")?,
            output: take_content(at, &mut fields, "output")?,
        },
        "reasoning" => ItemKind::Reasoning {
            summary: parse_summary(at, &mut fields)?,
            encrypted_content: take_optional_string(&mut fields, at, "encrypted_content")?,
        },
        _ => ItemKind::Other { kind },
    };
    Ok(InputItem {
        kind,
        extra: fields,
    })
}

fn parse_role(at: &At<'_>, fields: &mut Map<String, Value>) -> Result<ResponsesRole, GatewayError> {
    let role_at = at.field("role");
    match take_string(fields, at, "role")?.as_str() {
        "user" => Ok(ResponsesRole::User),
        "assistant" => Ok(ResponsesRole::Assistant),
        "system" => Ok(ResponsesRole::System),
        "developer" => Ok(ResponsesRole::Developer),
        "tool" => {
            let param = role_at.param();
            Err(bad_request(
                &param,
                format!(
                    "`{param}` is \"tool\": the Responses API takes a tool's answer as a `function_call_output` item with the call's `call_id`; a message's role is user, assistant, system or developer"
                ),
            ))
        }
        other => Err(role_at.unknown(other, "user, assistant, system or developer")),
    }
}

/// The string or parts at `key` of the item at `at`: 400 when absent or
/// null, 422 when of another type.
fn take_content(
    at: &At<'_>,
    fields: &mut Map<String, Value>,
    key: &'static str,
) -> Result<ResponsesContent, GatewayError> {
    let at = at.field(key);
    let parts = match fields.remove(key) {
        Some(Value::String(text)) => return Ok(ResponsesContent::Text(text)),
        Some(Value::Array(parts)) => parts,
        None | Some(Value::Null) => {
            return Err(at.missing("a string or an array of content parts"));
        }
        Some(other) => return Err(at.wrong_type("a string or an array of content parts", &other)),
    };
    parts
        .into_iter()
        .enumerate()
        .map(|(index, part)| parse_part(&at.index(index), part))
        .collect::<Result<_, _>>()
        .map(ResponsesContent::Parts)
}

fn parse_part(at: &At<'_>, part: Value) -> Result<ContentPart, GatewayError> {
    let Value::Object(mut fields) = part else {
        return Err(at.wrong_type("an object with a string `type`", &part));
    };
    let kind = match fields.remove("type") {
        Some(Value::String(kind)) => kind,
        None | Some(Value::Null) => {
            return Err(at
                .field("type")
                .missing("each content part is an object with a string `type`"));
        }
        Some(other) => return Err(at.field("type").wrong_type("a string", &other)),
    };
    let kind = match kind.as_str() {
        "input_text" => PartKind::InputText {
            text: take_string(&mut fields, at, "text")?,
        },
        "output_text" => PartKind::OutputText {
            text: take_string(&mut fields, at, "text")?,
        },
        "refusal" => PartKind::Refusal {
            refusal: take_string(&mut fields, at, "refusal")?,
        },
        "input_image" => {
            let url = take_optional_string(&mut fields, at, "image_url")?;
            let file_id = take_optional_string(&mut fields, at, "file_id")?;
            let source = match (url, file_id) {
                (Some(url), _) => ImageSource::Url(url),
                (None, Some(file_id)) => ImageSource::FileId(file_id),
                (None, None) => {
                    return Err(at.field("image_url").missing(
                        "the image's URL (or a data URL), or an uploaded file's id in `file_id`",
                    ));
                }
            };
            PartKind::InputImage { source }
        }
        "input_file" => {
            let data = take_optional_string(&mut fields, at, "file_data")?;
            let url = take_optional_string(&mut fields, at, "file_url")?;
            let file_id = take_optional_string(&mut fields, at, "file_id")?;
            let source = match (data, url, file_id) {
                (Some(data), _, _) => FileSource::Data(data),
                (None, Some(url), _) => FileSource::Url(url),
                (None, None, Some(file_id)) => FileSource::FileId(file_id),
                (None, None, None) => {
                    return Err(at.field("file_data").missing(
                        "the file inline, or its URL in `file_url`, or an uploaded file's id in `file_id`",
                    ));
                }
            };
            PartKind::InputFile { source }
        }
        _ => PartKind::Other { kind },
    };
    Ok(ContentPart {
        kind,
        extra: fields,
    })
}

/// A reasoning item's `summary`: an array of `summary_text` parts.
fn parse_summary(
    at: &At<'_>,
    fields: &mut Map<String, Value>,
) -> Result<Vec<String>, GatewayError> {
    let at = at.field("summary");
    let parts = match fields.remove("summary") {
        Some(Value::Array(parts)) => parts,
        None | Some(Value::Null) => {
            return Err(at.missing("an array of {\"type\": \"summary_text\", \"text\"} parts, empty when there is none"));
        }
        Some(other) => return Err(at.wrong_type("an array", &other)),
    };
    parts
        .into_iter()
        .enumerate()
        .map(|(index, part)| {
            let at = at.index(index);
            let Value::Object(mut part) = part else {
                return Err(at.wrong_type("an object", &part));
            };
            let kind = take_string(&mut part, &at, "type")?;
            if kind != "summary_text" {
                return Err(at.field("type").unknown(&kind, "summary_text"));
            }
            take_string(&mut part, &at, "text")
        })
        .collect()
}

fn parse_tools(value: Option<Value>) -> Result<Option<Vec<ResponsesTool>>, GatewayError> {
    let at = At::Top("tools");
    let tools = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(tools)) => tools,
        Some(other) => return Err(at.wrong_type("an array", &other)),
    };
    tools
        .into_iter()
        .enumerate()
        .map(|(index, tool)| parse_tool(&at.index(index), tool))
        .collect::<Result<_, _>>()
        .map(Some)
}

fn parse_tool(at: &At<'_>, tool: Value) -> Result<ResponsesTool, GatewayError> {
    let Value::Object(mut fields) = tool else {
        return Err(at.wrong_type("an object with a string `type`", &tool));
    };
    let tool_type = take_string(&mut fields, at, "type")?;
    let kind = match tool_type.as_str() {
        "function" => {
            let name = take_string(&mut fields, at, "name")?;
            if name.is_empty() {
                let param = at.field("name").param();
                return Err(bad_request(&param, format!("`{param}` must not be empty")));
            }
            let description = take_optional_string(&mut fields, at, "description")?;
            let parameters = match fields.remove("parameters") {
                None | Some(Value::Null) => None,
                Some(Value::Object(schema)) => Some(schema),
                Some(other) => return Err(at.field("parameters").wrong_type("an object", &other)),
            };
            match fields.get("strict") {
                None | Some(Value::Null | Value::Bool(_)) => {}
                Some(other) => return Err(at.field("strict").wrong_type("a boolean", other)),
            }
            ResponsesToolKind::Function {
                name,
                description,
                parameters,
            }
        }
        // Any type the upstream might read as a search holds its fees:
        // the next dated version as well as a misspelling.
        kind if kind.starts_with("web_search") => ResponsesToolKind::WebSearch { tool_type },
        _ => ResponsesToolKind::Other { tool_type },
    };
    Ok(ResponsesTool {
        kind,
        extra: fields,
    })
}

fn parse_tool_choice(value: Option<Value>) -> Result<Option<ResponsesToolChoice>, GatewayError> {
    let at = At::Top("tool_choice");
    let mut fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(mode)) => {
            return match mode.as_str() {
                "none" | "auto" | "required" => Ok(Some(ResponsesToolChoice::Mode(mode))),
                other => Err(at.unknown(
                    other,
                    "\"none\", \"auto\", \"required\" or an object naming a tool",
                )),
            };
        }
        Some(Value::Object(fields)) => fields,
        Some(other) => {
            return Err(at.wrong_type(
                "a string such as \"auto\" or an object such as {\"type\": \"function\", \"name\": \"f\"}",
                &other,
            ));
        }
    };
    let tool_type = take_string(&mut fields, &at, "type")?;
    let name = take_optional_string(&mut fields, &at, "name")?;
    if name.is_none() && (tool_type == "function" || tool_type == "custom") {
        return Err(at.field("name").missing(&format!(
            "the tool to call, when `tool_choice.type` is {tool_type:?}"
        )));
    }
    Ok(Some(ResponsesToolChoice::Tool {
        tool_type,
        name,
        extra: fields,
    }))
}

fn parse_text(value: Option<Value>) -> Result<Option<TextConfig>, GatewayError> {
    let at = At::Top("text");
    let mut fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(fields)) => fields,
        Some(other) => {
            return Err(at.wrong_type(
                "an object such as {\"format\": {\"type\": \"text\"}}",
                &other,
            ));
        }
    };
    let format = match fields.remove("format") {
        None | Some(Value::Null) => None,
        Some(Value::Object(format)) => Some(parse_format(&at.field("format"), format)?),
        Some(other) => {
            return Err(at
                .field("format")
                .wrong_type("an object such as {\"type\": \"text\"}", &other));
        }
    };
    let verbosity = one_of(
        &at.field("verbosity"),
        fields.remove("verbosity"),
        &["low", "medium", "high"],
    )?;
    Ok(Some(TextConfig {
        format,
        verbosity,
        extra: fields,
    }))
}

fn parse_format(at: &At<'_>, mut fields: Map<String, Value>) -> Result<TextFormat, GatewayError> {
    let kind = take_string(&mut fields, at, "type")?;
    match kind.as_str() {
        "text" => Ok(TextFormat::Text),
        "json_object" => Ok(TextFormat::JsonObject),
        "json_schema" => {
            let name = take_string(&mut fields, at, "name")?;
            let schema = match fields.remove("schema") {
                Some(Value::Object(schema)) => schema,
                None | Some(Value::Null) => {
                    return Err(at
                        .field("schema")
                        .missing("the JSON Schema of the output, an object"));
                }
                Some(other) => return Err(at.field("schema").wrong_type("an object", &other)),
            };
            Ok(TextFormat::JsonSchema {
                name,
                schema,
                extra: fields,
            })
        }
        other => Err(at
            .field("type")
            .unknown(other, "text, json_object or json_schema")),
    }
}

fn parse_reasoning(value: Option<Value>) -> Result<Option<ReasoningConfig>, GatewayError> {
    let at = At::Top("reasoning");
    let mut fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(fields)) => fields,
        Some(other) => {
            return Err(at.wrong_type("an object such as {\"effort\": \"medium\"}", &other));
        }
    };
    let effort = one_of(
        &at.field("effort"),
        fields.remove("effort"),
        &["none", "minimal", "low", "medium", "high", "xhigh"],
    )?;
    let summary = one_of(
        &at.field("summary"),
        fields.remove("summary"),
        &["auto", "concise", "detailed", "none"],
    )?;
    Ok(Some(ReasoningConfig {
        effort,
        summary,
        extra: fields,
    }))
}

fn parse_metadata(value: Option<Value>) -> Result<Option<Map<String, Value>>, GatewayError> {
    let metadata = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(metadata)) => metadata,
        Some(other) => return Err(At::Top("metadata").wrong_type("an object", &other)),
    };
    if let Some((key, value)) = metadata.iter().find(|(_, value)| !value.is_string()) {
        return Err(wrong_type(&format!("metadata.{key}"), "a string", value));
    }
    Ok(Some(metadata))
}

fn parse_include(value: Option<Value>) -> Result<Option<Vec<String>>, GatewayError> {
    let at = At::Top("include");
    let values = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(values)) => values,
        Some(other) => return Err(at.wrong_type("an array of strings", &other)),
    };
    values
        .into_iter()
        .enumerate()
        .map(|(index, value)| match value {
            Value::String(value) => Ok(value),
            other => Err(at.index(index).wrong_type("a string", &other)),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// An optional string among `known`: absent or null is `None`; 400 for
/// another string, 422 for another type.
fn one_of(
    at: &At<'_>,
    value: Option<Value>,
    known: &[&str],
) -> Result<Option<String>, GatewayError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if known.contains(&text.as_str()) => Ok(Some(text)),
        Some(Value::String(text)) => Err(at.unknown(&text, &known.join(", "))),
        Some(other) => Err(at.wrong_type("a string", &other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_input::strategies::{any_json, collect_pointers};
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(value: &Value) -> Result<ResponsesRequest, GatewayError> {
        ResponsesRequest::parse(value.to_string().as_bytes())
    }

    fn minimal() -> Value {
        json!({"model": "openai/gpt-5", "input": "Hi"})
    }

    fn with(field: &str, value: Value) -> Value {
        let mut request = minimal();
        request[field] = value;
        request
    }

    /// The minimal request whose input is these items.
    fn items(items: Value) -> Value {
        with("input", items)
    }

    /// The minimal request whose one user message holds this part.
    fn user_part(part: Value) -> Value {
        items(json!([{"role": "user", "content": [part]}]))
    }

    /// The body Codex CLI 0.169 sends, shortened: instructions, a
    /// developer and a user message, a reasoning item passed back
    /// encrypted, a function call round trip, a custom tool call, function
    /// tools, a web search tool and a namespace entry, and no
    /// `max_output_tokens`.
    fn codex() -> Value {
        json!({
            "model": "openai/gpt-5-codex",
            "instructions": "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI.",
            "input": [
                {"type": "message", "role": "developer", "content": [
                    {"type": "input_text", "text": "<permissions instructions>workspace-write</permissions instructions>"}]},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "<environment_context><cwd>/repo</cwd></environment_context>"},
                    {"type": "input_text", "text": "Run the tests."}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "**Running tests**"}],
                 "content": null, "encrypted_content": "gAAAAABo_encrypted"},
                {"type": "function_call", "name": "exec_command", "arguments": "{\"cmd\":\"cargo test\"}", "call_id": "call_1"},
                {"type": "function_call_output", "call_id": "call_1", "output": "test result: ok. 3 passed"},
                {"type": "custom_tool_call", "status": "completed", "call_id": "call_2", "name": "apply_patch",
                 "input": "*** Begin Patch\n*** End Patch"},
                {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done!"},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "All tests pass.", "annotations": []}]}
            ],
            "tools": [
                {"type": "function", "name": "exec_command", "description": "Runs a command in a PTY.", "strict": false,
                 "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"], "additionalProperties": false}},
                {"type": "custom", "name": "apply_patch", "description": "Edits files.",
                 "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}},
                {"type": "web_search"},
                {"type": "namespace", "name": "mcp__docs", "tools": []}
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": false,
            "stream": true,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "0199a2b3-session",
            "text": {"verbosity": "medium"}
        })
    }

    /// The refusal's status, `metadata.param` and message.
    fn refusal(body: &Value) -> (u16, String, String) {
        let error = parse(body).expect_err("refused");
        let param = error
            .metadata()
            .get("param")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        (error.status().as_u16(), param, error.message().to_owned())
    }

    #[test]
    fn a_codex_body_parses_with_every_field_read() {
        let request = parse(&codex()).unwrap();
        assert_eq!(request.model_id.as_str(), "openai/gpt-5-codex");
        assert!(request.stream);
        assert_eq!(request.store, Some(false));
        assert_eq!(request.max_output_tokens, None);
        assert_eq!(request.parallel_tool_calls, Some(false));
        assert_eq!(
            request.tool_choice,
            Some(ResponsesToolChoice::Mode("auto".into()))
        );
        let reasoning = request.reasoning.as_ref().unwrap();
        assert_eq!(reasoning.effort.as_deref(), Some("medium"));
        assert_eq!(reasoning.summary.as_deref(), Some("auto"));
        assert_eq!(
            request.include.as_deref(),
            Some(&["reasoning.encrypted_content".to_owned()][..])
        );
        assert_eq!(
            request.prompt_cache_key.as_deref(),
            Some("0199a2b3-session")
        );
        assert_eq!(
            request.text.as_ref().unwrap().verbosity.as_deref(),
            Some("medium")
        );
        assert!(request.extra.is_empty(), "{:?}", request.extra);
        let tools = request.tools.as_ref().unwrap();
        assert!(
            matches!(&tools[0].kind, ResponsesToolKind::Function { name, parameters: Some(schema), .. }
            if name == "exec_command" && schema["required"] == json!(["cmd"]))
        );
        assert_eq!(tools[0].extra["strict"], false);
        assert_eq!(
            tools[1].kind,
            ResponsesToolKind::Other {
                tool_type: "custom".into()
            }
        );
        assert_eq!(
            tools[2].kind,
            ResponsesToolKind::WebSearch {
                tool_type: "web_search".into()
            }
        );
        // Other kinds are kept as sent.
        assert_eq!(
            tools[3].kind,
            ResponsesToolKind::Other {
                tool_type: "namespace".into()
            }
        );
        assert_eq!(tools[3].extra["name"], "mcp__docs");
        let ResponsesInput::Items(items) = &request.input else {
            panic!("items")
        };
        assert_eq!(items.len(), 8);
        assert!(matches!(
            &items[0].kind,
            ItemKind::Message {
                role: ResponsesRole::Developer,
                ..
            }
        ));
        assert_eq!(
            items[2].kind,
            ItemKind::Reasoning {
                summary: vec!["**Running tests**".into()],
                encrypted_content: Some("gAAAAABo_encrypted".into()),
            }
        );
        assert_eq!(items[2].extra["content"], Value::Null);
        assert_eq!(
            items[3].kind,
            ItemKind::FunctionCall {
                call_id: "call_1".into(),
                name: "exec_command".into(),
                arguments: "{\"cmd\":\"cargo test\"}".into(),
            }
        );
        assert_eq!(
            items[4].kind,
            ItemKind::FunctionCallOutput {
                call_id: "call_1".into(),
                output: ResponsesContent::Text("test result: ok. 3 passed".into()),
            }
        );
        assert_eq!(
            items[5].kind,
            ItemKind::CustomToolCall {
                call_id: "call_2".into(),
                name: "apply_patch".into(),
                input: "*** Begin Patch\n*** End Patch".into(),
            }
        );
        assert_eq!(items[5].extra["status"], "completed");
        let ItemKind::Message { role, content } = &items[7].kind else {
            panic!("message")
        };
        assert_eq!(*role, ResponsesRole::Assistant);
        let ResponsesContent::Parts(parts) = content else {
            panic!("parts")
        };
        assert_eq!(
            parts[0].kind,
            PartKind::OutputText {
                text: "All tests pass.".into()
            }
        );
        assert_eq!(parts[0].extra["annotations"], json!([]));
        // Codex sends no `max_tool_calls`: the gateway adds its own.
        assert_eq!(
            request.web_search_max_uses(),
            Some(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS)
        );
        assert_eq!(
            request.max_tool_calls_to_add(),
            Some(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS)
        );
        let size = request.prompt_size();
        // The instructions and eight items; the web search and namespace
        // tools are expanded upstream.
        assert_eq!(size.message_count, 9);
        assert_eq!(size.server_tool_count, 2);
        assert_eq!(
            (
                size.image_count,
                size.document_count,
                size.unmeasured_block_count
            ),
            (0, 0, 0)
        );
    }

    #[test]
    fn every_item_and_part_kind_is_read_and_measured() {
        let body = json!({
            "model": "a/b",
            "instructions": "ins",
            "input": [
                {"role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "high"},
                    {"type": "input_image", "file_id": "file_1"},
                    {"type": "input_file", "file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"},
                    {"type": "input_file", "file_url": "https://e.x/a.pdf"},
                    {"type": "input_file", "file_id": "file_2"},
                    {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}
                ]},
                {"role": "system", "content": "sys"},
                {"type": "message", "role": "assistant", "id": "msg_1", "content": [
                    {"type": "refusal", "refusal": "no"}]},
                {"type": "function_call_output", "call_id": "c", "output": [
                    {"type": "input_text", "text": "out"},
                    {"type": "input_image", "image_url": "https://e.x/b.png"}]},
                {"type": "reasoning", "summary": []},
                {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
                {"type": "item_reference", "id": "msg_0"}
            ],
            "text": {"format": {"type": "json_schema", "name": "out", "strict": true,
                                "schema": {"type": "object"}}},
            "prompt": {"id": "pmpt_1"}
        });
        let request = parse(&body).unwrap();
        let ResponsesInput::Items(items) = &request.input else {
            panic!("items")
        };
        let ItemKind::Message { content, role } = &items[0].kind else {
            panic!("message")
        };
        assert_eq!(*role, ResponsesRole::User);
        let ResponsesContent::Parts(parts) = content else {
            panic!("parts")
        };
        let kinds: Vec<&PartKind> = parts.iter().map(|part| &part.kind).collect();
        assert_eq!(
            kinds,
            [
                &PartKind::InputText {
                    text: "look".into()
                },
                &PartKind::InputImage {
                    source: ImageSource::Url("data:image/png;base64,iVBO".into())
                },
                &PartKind::InputImage {
                    source: ImageSource::FileId("file_1".into())
                },
                &PartKind::InputFile {
                    source: FileSource::Data("data:application/pdf;base64,JVBE".into())
                },
                &PartKind::InputFile {
                    source: FileSource::Url("https://e.x/a.pdf".into())
                },
                &PartKind::InputFile {
                    source: FileSource::FileId("file_2".into())
                },
                &PartKind::Other {
                    kind: "input_audio".into()
                },
            ]
        );
        assert_eq!(parts[1].extra["detail"], "high");
        assert_eq!(parts[3].extra["filename"], "a.pdf");
        assert!(matches!(
            &items[1].kind,
            ItemKind::Message { role: ResponsesRole::System, content: ResponsesContent::Text(text) } if text == "sys"
        ));
        assert_eq!(items[2].extra["id"], "msg_1");
        assert_eq!(
            items[5].kind,
            ItemKind::Other {
                kind: "web_search_call".into()
            }
        );
        assert!(matches!(
            &request.text.as_ref().unwrap().format,
            Some(TextFormat::JsonSchema { name, extra, .. }) if name == "out" && extra["strict"] == true
        ));
        let size = request.prompt_size();
        // Images: two in the message, one in the tool output; files: three;
        // unmeasured: the audio part, the web search call, the item
        // reference and the stored prompt template.
        assert_eq!(
            (
                size.image_count,
                size.document_count,
                size.unmeasured_block_count,
                size.message_count,
                size.server_tool_count
            ),
            (3, 3, 4, 8, 0)
        );
        let expected = "ins".len()
            + "look".len()
            + "sys".len()
            + "no".len()
            + "cout".len()
            // The output format's name.
            + "out".len();
        let extras = json_bytes(&json!({"detail": "high"}))
            + json_bytes(&json!({"filename": "a.pdf"}))
            + json_bytes(&json!({"id": "msg_1"}))
            + json_bytes(&json!({"type": "object"}))
            + json_bytes(&json!({"strict": true}))
            + json_bytes(&json!({"prompt": {"id": "pmpt_1"}}));
        assert_eq!(size.measured_bytes, expected as u64 + extras);
    }

    #[test]
    fn the_prompt_size_counts_a_string_input_tools_and_extras() {
        let body = json!({
            "model": "a/b",
            "input": "hello",
            "tools": [
                {"type": "function", "name": "f", "description": "dd", "parameters": {"type": "object"}, "strict": true},
                {"type": "file_search", "vector_store_ids": ["vs_1"]}
            ],
            "metadata": {"k": "not counted"},
            "reasoning": {"effort": "high"},
            "top_logprobs": 2
        });
        let size = parse(&body).unwrap().prompt_size();
        let expected = "hello".len() as u64
            + "fdd".len() as u64
            + json_bytes(&json!({"type": "object"}))
            + json_bytes(&json!({"strict": true}))
            + json_bytes(&json!({"vector_store_ids": ["vs_1"]}))
            + json_bytes(&json!({"top_logprobs": 2}));
        assert_eq!(
            size,
            PromptSize {
                measured_bytes: expected,
                image_count: 0,
                document_count: 0,
                unmeasured_block_count: 0,
                message_count: 1,
                server_tool_count: 1,
            }
        );
    }

    #[test]
    fn what_needs_a_stored_response_is_refused_saying_what_to_send() {
        let (status, param, message) = refusal(&with("store", json!(true)));
        assert_eq!((status, param.as_str()), (400, "store"));
        assert!(message.contains("stateless"), "{message}");
        assert!(message.contains("send `store: false`"), "{message}");
        let (status, param, message) = refusal(&with("previous_response_id", json!("resp_1")));
        assert_eq!((status, param.as_str()), (400, "previous_response_id"));
        assert!(message.contains("stateless"), "{message}");
        assert!(
            message.contains("send the whole conversation in `input`"),
            "{message}"
        );
        let (status, param, message) = refusal(&with("conversation", json!("conv_1")));
        assert_eq!((status, param.as_str()), (400, "conversation"));
        assert!(message.contains("send the whole conversation in `input`"));
        let (status, param, message) = refusal(&with("background", json!(true)));
        assert_eq!((status, param.as_str()), (400, "background"));
        assert!(message.contains("send `background: false`"), "{message}");
        // Said before the input is read: a request that leans on a stored
        // response is told so, not that its input is short.
        let mut continued = json!({"model": "a/b", "previous_response_id": "resp_1"});
        assert_eq!(refusal(&continued).1, "previous_response_id");
        continued["store"] = json!(true);
        assert_eq!(refusal(&continued).1, "store");
        // What keeps nothing is fine.
        for (field, value) in [
            ("store", json!(false)),
            ("store", Value::Null),
            ("previous_response_id", Value::Null),
            ("conversation", Value::Null),
            ("background", json!(false)),
        ] {
            let request = parse(&with(field, value.clone()));
            assert!(request.is_ok(), "{field} = {value}: {:?}", request.err());
        }
        assert_eq!(refusal(&with("store", json!("no"))).0, 422);
        assert_eq!(refusal(&with("background", json!(1))).0, 422);
    }

    #[test]
    fn web_searches_are_bounded_by_max_tool_calls_or_the_gateways_default() {
        let tools = |tools: Value, max: Option<u64>| {
            let mut body = with("tools", tools);
            if let Some(max) = max {
                body["max_tool_calls"] = json!(max);
            }
            parse(&body).unwrap()
        };
        for kind in [
            "web_search",
            "web_search_preview",
            "web_search_2025_08_26",
            "web_search_preview_2025_03_11",
        ] {
            let request = tools(json!([{"type": kind}]), None);
            assert_eq!(
                request.web_search_max_uses(),
                Some(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS),
                "{kind}"
            );
            assert_eq!(
                request.max_tool_calls_to_add(),
                Some(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS)
            );
            let request = tools(
                json!([{"type": kind, "search_context_size": "low"}]),
                Some(3),
            );
            assert_eq!(request.web_search_max_uses(), Some(3));
            assert_eq!(request.max_tool_calls_to_add(), None);
        }
        // Two web search tools share the one bound of the response.
        let request = tools(
            json!([{"type": "web_search"}, {"type": "web_search_preview"}]),
            Some(2),
        );
        assert_eq!(request.web_search_max_uses(), Some(2));
        // No search, nothing to bound or add.
        let request = tools(json!([{"type": "function", "name": "f"}]), None);
        assert_eq!(
            (
                request.web_search_max_uses(),
                request.max_tool_calls_to_add()
            ),
            (None, None)
        );
        assert_eq!(parse(&minimal()).unwrap().web_search_max_uses(), None);
        // None at all.
        let request = tools(json!([{"type": "web_search"}]), Some(0));
        assert_eq!(request.web_search_max_uses(), Some(0));
        assert_eq!(refusal(&with("max_tool_calls", json!(-1))).0, 422);
    }

    #[test]
    fn what_is_missing_empty_or_unknown_is_a_400_naming_it() {
        let mut no_model = minimal();
        no_model.as_object_mut().unwrap().remove("model");
        let mut no_input = minimal();
        no_input.as_object_mut().unwrap().remove("input");
        let cases: Vec<(Value, &str, &str)> = vec![
            (no_model, "model", "`model` is required"),
            (with("model", json!(" ")), "model", "must not be empty"),
            (no_input, "input", "`input` is required"),
            (with("input", json!(null)), "input", "stateless"),
            (items(json!([])), "input", "at least one item"),
            (
                items(json!([{"content": "x"}])),
                "input[0].type",
                "is required",
            ),
            (
                items(json!([{"type": "message", "content": "x"}])),
                "input[0].role",
                "is required",
            ),
            (
                items(json!([{"role": "tool", "content": "x"}])),
                "input[0].role",
                "`function_call_output`",
            ),
            (
                items(json!([{"role": "bot", "content": "x"}])),
                "input[0].role",
                "\"bot\"",
            ),
            (
                items(json!([{"role": "user"}])),
                "input[0].content",
                "is required",
            ),
            (
                items(json!([{"role": "user", "content": null}])),
                "input[0].content",
                "is required",
            ),
            (
                user_part(json!({"text": "x"})),
                "input[0].content[0].type",
                "is required",
            ),
            (
                user_part(json!({"type": "input_text"})),
                "input[0].content[0].text",
                "is required",
            ),
            (
                user_part(json!({"type": "input_image", "detail": "low"})),
                "input[0].content[0].image_url",
                "`file_id`",
            ),
            (
                user_part(json!({"type": "input_file", "filename": "a.pdf"})),
                "input[0].content[0].file_data",
                "`file_url`",
            ),
            (
                items(json!([{"role": "assistant", "content": [{"type": "refusal"}]}])),
                "input[0].content[0].refusal",
                "is required",
            ),
            (
                items(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
                "input[0].call_id",
                "is required",
            ),
            (
                items(json!([{"type": "function_call", "call_id": "c", "name": "f"}])),
                "input[0].arguments",
                "is required",
            ),
            (
                items(json!([{"type": "function_call_output", "call_id": "c"}])),
                "input[0].output",
                "is required",
            ),
            (
                items(json!([{"type": "custom_tool_call", "call_id": "c", "name": "f"}])),
                "input[0].input",
                "is required",
            ),
            (
                items(json!([{"type": "reasoning", "encrypted_content": "E"}])),
                "input[0].summary",
                "is required",
            ),
            (
                items(json!([{"type": "reasoning", "summary": [{"type": "text", "text": "t"}]}])),
                "input[0].summary[0].type",
                "summary_text",
            ),
            (
                with("tools", json!([{"name": "f"}])),
                "tools[0].type",
                "is required",
            ),
            (
                with("tools", json!([{"type": "function"}])),
                "tools[0].name",
                "is required",
            ),
            (
                with("tools", json!([{"type": "function", "name": ""}])),
                "tools[0].name",
                "must not be empty",
            ),
            (
                with("tool_choice", json!("any")),
                "tool_choice",
                "\"required\"",
            ),
            (
                with("tool_choice", json!({"type": "function"})),
                "tool_choice.name",
                "is required",
            ),
            (
                with("text", json!({"format": {"type": "yaml"}})),
                "text.format.type",
                "json_schema",
            ),
            (
                with(
                    "text",
                    json!({"format": {"type": "json_schema", "name": "n"}}),
                ),
                "text.format.schema",
                "is required",
            ),
            (
                with("text", json!({"verbosity": "loud"})),
                "text.verbosity",
                "low, medium, high",
            ),
            (
                with("reasoning", json!({"effort": "max"})),
                "reasoning.effort",
                "\"max\"",
            ),
            (
                with("reasoning", json!({"summary": "long"})),
                "reasoning.summary",
                "concise",
            ),
            (with("truncation", json!("yes")), "truncation", "disabled"),
            (with("service_tier", json!("gold")), "service_tier", "flex"),
        ];
        for (body, param, words) in cases {
            let (status, got_param, message) = refusal(&body);
            assert_eq!(status, 400, "{param}: {message}");
            assert_eq!(got_param, param, "{message}");
            assert!(message.contains(param), "{message}");
            assert!(message.contains(words), "{param}: {message}");
        }
    }

    #[test]
    fn a_wrong_type_or_a_number_out_of_range_is_a_422_naming_it() {
        let cases: Vec<(Value, &str)> = vec![
            (with("model", json!(5)), "model"),
            (with("input", json!(5)), "input"),
            (with("input", json!({"role": "user"})), "input"),
            (items(json!(["Hi"])), "input[0]"),
            (items(json!([{"type": 1}])), "input[0].type"),
            (items(json!([{"role": 1, "content": "x"}])), "input[0].role"),
            (
                items(json!([{"role": "user", "content": 1}])),
                "input[0].content",
            ),
            (
                items(json!([{"role": "user", "content": [1]}])),
                "input[0].content[0]",
            ),
            (
                user_part(json!({"type": "input_image", "image_url": {"url": "u"}})),
                "input[0].content[0].image_url",
            ),
            (
                user_part(json!({"type": "input_file", "file_id": 3})),
                "input[0].content[0].file_id",
            ),
            (
                items(
                    json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]),
                ),
                "input[0].arguments",
            ),
            (
                items(json!([{"type": "reasoning", "summary": [], "encrypted_content": 5}])),
                "input[0].encrypted_content",
            ),
            (
                items(json!([{"type": "reasoning", "summary": "s"}])),
                "input[0].summary",
            ),
            (with("instructions", json!(["x"])), "instructions"),
            (with("tools", json!({})), "tools"),
            (
                with(
                    "tools",
                    json!([{"type": "function", "name": "f", "parameters": "{}"}]),
                ),
                "tools[0].parameters",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "function", "name": "f", "strict": "yes"}]),
                ),
                "tools[0].strict",
            ),
            (with("tool_choice", json!(1)), "tool_choice"),
            (
                with("parallel_tool_calls", json!("yes")),
                "parallel_tool_calls",
            ),
            (with("text", json!("json")), "text"),
            (with("reasoning", json!("high")), "reasoning"),
            (with("reasoning", json!({"effort": 3})), "reasoning.effort"),
            (with("stream", json!("yes")), "stream"),
            (with("max_output_tokens", json!(0)), "max_output_tokens"),
            (with("max_output_tokens", json!(1.5)), "max_output_tokens"),
            (with("max_output_tokens", json!("9")), "max_output_tokens"),
            (with("temperature", json!(2.5)), "temperature"),
            (with("top_p", json!(-0.1)), "top_p"),
            (with("metadata", json!([])), "metadata"),
            (with("metadata", json!({"n": 1})), "metadata.n"),
            (with("include", json!("x")), "include"),
            (with("include", json!(["x", 1])), "include[1]"),
            (with("prompt_cache_key", json!(1)), "prompt_cache_key"),
            (with("user", json!(1)), "user"),
            (with("truncation", json!(true)), "truncation"),
        ];
        for (body, param) in cases {
            let (status, got_param, message) = refusal(&body);
            assert_eq!(status, 422, "{param}: {message}");
            assert_eq!(got_param, param, "{message}");
            assert!(message.contains(param), "{message}");
        }
    }

    #[test]
    fn each_optional_field_is_read_and_null_is_absent() {
        let request = parse(
            &json!({"model": "a/b", "input": "Hi", "max_output_tokens": 1, "temperature": 2,
            "top_p": 0, "metadata": {"k": "v"}, "user": "u", "truncation": "auto",
            "service_tier": "flex", "tool_choice": {"type": "web_search_preview"},
            "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "xhigh", "generate_summary": "auto"},
            "stream_options": {"include_obfuscation": false}, "safety_identifier": "s"}),
        )
        .unwrap();
        assert_eq!(request.max_output_tokens, Some(1));
        assert_eq!(request.temperature, Some(2.0));
        assert_eq!(request.top_p, Some(0.0));
        assert_eq!(request.metadata.as_ref().unwrap()["k"], "v");
        assert_eq!(request.user.as_deref(), Some("u"));
        assert_eq!(request.truncation.as_deref(), Some("auto"));
        assert_eq!(request.service_tier.as_deref(), Some("flex"));
        assert_eq!(
            request.tool_choice,
            Some(ResponsesToolChoice::Tool {
                tool_type: "web_search_preview".into(),
                name: None,
                extra: Map::new()
            })
        );
        assert_eq!(
            request.text.as_ref().unwrap().format,
            Some(TextFormat::JsonObject)
        );
        assert_eq!(
            request.reasoning.as_ref().unwrap().extra["generate_summary"],
            "auto"
        );
        assert_eq!(
            request.extra.keys().collect::<Vec<_>>(),
            ["safety_identifier", "stream_options"]
        );
        for field in [
            "instructions",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "max_tool_calls",
            "text",
            "reasoning",
            "stream",
            "max_output_tokens",
            "temperature",
            "top_p",
            "metadata",
            "include",
            "prompt_cache_key",
            "user",
            "truncation",
            "service_tier",
        ] {
            assert!(parse(&with(field, Value::Null)).is_ok(), "{field}: null");
        }
        let request = parse(&with(
            "tool_choice",
            json!({"type": "function", "name": "exec_command"}),
        ))
        .unwrap();
        assert!(matches!(
            request.tool_choice,
            Some(ResponsesToolChoice::Tool { name: Some(name), .. }) if name == "exec_command"
        ));
        let request = parse(&minimal()).unwrap();
        assert_eq!(request.input, ResponsesInput::Text("Hi".into()));
        assert!(!request.stream);
    }

    #[test]
    fn a_body_wrong_as_a_whole_is_a_400_naming_no_field() {
        for body in [
            &b"not json"[..],
            b"[1]",
            b"{\"model\": \"a/b\", \"model\": \"c/d\", \"input\": \"x\"}",
        ] {
            let error = ResponsesRequest::parse(body).unwrap_err();
            assert_eq!(error.status(), 400);
        }
        let error =
            ResponsesRequest::parse(br#"{"model": "not a model", "input": "x"}"#).unwrap_err();
        assert_eq!(error.status(), 400);
    }

    fn words_json() -> impl Strategy<Value = Value> {
        any_json(
            &[
                "message",
                "user",
                "input_text",
                "input_image",
                "function_call",
                "reasoning",
                "web_search",
                "function",
            ],
            &["type", "role", "content", "text", "name", "call_id"],
        )
    }

    /// A JSON pointer, the path errors name, and the check of the type.
    type TypedPlace = (&'static str, &'static str, fn(&Value) -> bool);

    /// Where a typed value stands in the Codex body, and whether a value is
    /// of its type: replacing it with a value of another type must be a
    /// 422 naming that path.
    fn typed_places() -> Vec<TypedPlace> {
        vec![
            ("/model", "model", Value::is_string),
            ("/input", "input", |v| v.is_string() || v.is_array()),
            ("/instructions", "instructions", Value::is_string),
            ("/stream", "stream", Value::is_boolean),
            ("/store", "store", Value::is_boolean),
            (
                "/parallel_tool_calls",
                "parallel_tool_calls",
                Value::is_boolean,
            ),
            ("/include", "include", Value::is_array),
            ("/include/0", "include[0]", Value::is_string),
            ("/prompt_cache_key", "prompt_cache_key", Value::is_string),
            ("/reasoning", "reasoning", Value::is_object),
            ("/reasoning/effort", "reasoning.effort", Value::is_string),
            ("/text", "text", Value::is_object),
            ("/tools", "tools", Value::is_array),
            ("/tools/0/name", "tools[0].name", Value::is_string),
            (
                "/tools/0/parameters",
                "tools[0].parameters",
                Value::is_object,
            ),
            ("/tools/0/strict", "tools[0].strict", Value::is_boolean),
            ("/tools/2/type", "tools[2].type", Value::is_string),
            ("/input/0/content", "input[0].content", |v| {
                v.is_string() || v.is_array()
            }),
            (
                "/input/1/content/1/text",
                "input[1].content[1].text",
                Value::is_string,
            ),
            ("/input/1/role", "input[1].role", Value::is_string),
            ("/input/2/summary", "input[2].summary", Value::is_array),
            (
                "/input/2/encrypted_content",
                "input[2].encrypted_content",
                Value::is_string,
            ),
            ("/input/3/arguments", "input[3].arguments", Value::is_string),
            ("/input/4/output", "input[4].output", |v| {
                v.is_string() || v.is_array()
            }),
            ("/input/5/input", "input[5].input", Value::is_string),
        ]
    }

    proptest! {
        /// Any JSON value of another type in a typed place is a 422 naming
        /// that place; never a 400 or a panic.
        #[test]
        fn any_value_of_the_wrong_type_is_422_naming_its_path(value in words_json(), place in 0usize..25) {
            let (pointer, param, right_type) = typed_places()[place];
            prop_assume!(!right_type(&value) && !value.is_null());
            let mut body = codex();
            *body.pointer_mut(pointer).expect("the place exists") = value;
            let error = parse(&body).unwrap_err();
            prop_assert_eq!(error.status().as_u16(), 422, "{}", error.message());
            prop_assert_eq!(&error.metadata()["param"], param);
        }

        /// Any JSON value anywhere in a valid body is accepted or refused
        /// with a 400 or 422 naming a field, never a panic.
        #[test]
        fn arbitrary_json_anywhere_never_panics(value in words_json(), place in 0usize..96) {
            let mut body = codex();
            let mut pointers = Vec::new();
            collect_pointers(&body, String::new(), &mut pointers);
            let pointer = &pointers[place % pointers.len()];
            *body.pointer_mut(pointer).expect("the place exists") = value;
            match parse(&body) {
                Ok(request) => {
                    let _ = request.prompt_size();
                }
                Err(error) => {
                    prop_assert!(matches!(error.status().as_u16(), 400 | 422));
                    prop_assert!(error.metadata()["param"].is_string(), "{}", error.message());
                }
            }
        }

        #[test]
        fn arbitrary_json_bodies_never_panic(value in words_json()) {
            let _ = parse(&value);
            let _ = parse(&json!({"model": "a/b", "input": [value.clone()]}));
            let _ = parse(&json!({"model": "a/b", "input": [{"role": "user", "content": [value]}]}));
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ResponsesRequest::parse(&body);
        }

        /// A valid generated request parses to what was sent, and its
        /// prompt size is never below the bytes of its text.
        #[test]
        fn valid_requests_parse_to_what_was_sent(
            model in "[a-z0-9-]{1,12}/[a-zA-Z0-9._-]{1,20}(:free)?",
            turns in proptest::collection::vec((any::<String>(), 0usize..4, any::<bool>()), 1..6),
            instructions in proptest::option::of(any::<String>()),
            max_output_tokens in proptest::option::of(1u64..1_000_000),
            max_tool_calls in proptest::option::of(0u64..100),
            web_search in any::<bool>(),
            stream in any::<bool>(),
            as_text in any::<bool>(),
        ) {
            // Each turn is a message of a role (as a string or a part), a
            // function call or its output.
            let roles = ["user", "assistant", "system", "developer"];
            let input: Value = if as_text {
                json!(turns[0].0)
            } else {
                turns.iter().map(|(text, kind, as_part)| match kind {
                    0 | 1 => {
                        let role = roles[(text.len() + kind) % 4];
                        let part = if role == "assistant" { "output_text" } else { "input_text" };
                        let content = if *as_part { json!([{"type": part, "text": text}]) } else { json!(text) };
                        json!({"role": role, "content": content})
                    }
                    2 => json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": text}),
                    _ => json!({"type": "function_call_output", "call_id": "c", "output": text}),
                }).collect()
            };
            let mut body = json!({"model": model, "input": input, "stream": stream, "store": false});
            if let Some(instructions) = &instructions { body["instructions"] = json!(instructions); }
            if let Some(max) = max_output_tokens { body["max_output_tokens"] = json!(max); }
            if let Some(max) = max_tool_calls { body["max_tool_calls"] = json!(max); }
            if web_search { body["tools"] = json!([{"type": "web_search"}]); }
            let request = parse(&body).unwrap();
            prop_assert_eq!(&request.model, &model);
            prop_assert_eq!(request.model_id.as_str(), model.as_str());
            prop_assert_eq!(request.stream, stream);
            prop_assert_eq!(request.max_output_tokens, max_output_tokens);
            prop_assert_eq!(&request.instructions, &instructions);
            let searches = web_search.then(|| max_tool_calls.unwrap_or(DEFAULT_WEB_SEARCH_MAX_TOOL_CALLS));
            prop_assert_eq!(request.web_search_max_uses(), searches);
            let text_bytes: usize = if as_text { turns[0].0.len() } else { turns.iter().map(|(text, _, _)| text.len()).sum() }
                + instructions.as_ref().map_or(0, String::len);
            let size = request.prompt_size();
            prop_assert!(size.measured_bytes >= text_bytes as u64);
            let items = if as_text { 1 } else { turns.len() };
            prop_assert_eq!(size.message_count, (items + usize::from(instructions.is_some())) as u64);
        }
    }
}
