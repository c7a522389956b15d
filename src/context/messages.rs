//! The Anthropic Messages request (`POST /v1/messages`, and its
//! `count_tokens` twin): parsed once, validated, and measured for a hold.
//!
//! [`MessagesRequest::parse`] reads the body Anthropic's clients (Claude
//! Code, the SDKs) send; [`MessagesRequest::parse_count_tokens`] the same
//! body without `max_tokens` and `stream`. Bad input is refused as
//! [`ChatRequest::parse`](super::ChatRequest::parse) refuses it: 400
//! `invalid_request_error` for what is missing, empty or an unknown value,
//! 422 `invalid_parameter` for a wrong type or a number out of range, each
//! naming the field's path (`messages[2].content[0].source.media_type`) in
//! its message and in `metadata.param`. Fields the gateway does not read
//! are kept as sent (`extra`, at every level), so a newer client's fields
//! pass.
//!
//! What a hold needs is read from the parsed request:
//! [`MessagesRequest::prompt_size`] (the prompt's text in bytes, its
//! images and documents, the blocks the gateway cannot measure),
//! [`MessagesRequest::max_tokens`], [`MessagesRequest::thinking_budget_tokens`]
//! and [`MessagesRequest::web_search_max_uses`]. A web search tool without
//! `max_uses` is refused here (400 naming `tools[i].max_uses`): each
//! search has a fee, so the searches must be bounded before a hold can be.
//!
//! ```
//! use modelgate::body::{BlockKind, MessagesContent, MessagesRequest};
//!
//! let body = br#"{
//!     "model": "anthropic/claude-sonnet-4.5",
//!     "max_tokens": 4096,
//!     "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
//!     "messages": [{"role": "user", "content": [
//!         {"type": "text", "text": "What is in this picture?"},
//!         {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
//!     ]}],
//!     "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
//!     "thinking": {"type": "enabled", "budget_tokens": 2048}
//! }"#;
//! let request = MessagesRequest::parse(body).unwrap();
//! assert_eq!(request.max_tokens, Some(4096));
//! assert_eq!(request.thinking_budget_tokens(), Some(2048));
//! assert_eq!(request.web_search_max_uses(), Some(3));
//! let MessagesContent::Blocks(blocks) = &request.messages[0].content else { unreachable!() };
//! assert!(matches!(blocks[1].kind, BlockKind::Image { .. }));
//! let size = request.prompt_size();
//! assert_eq!(size.image_count, 1);
//! assert!(size.measured_bytes >= ("You are terse.".len() + "What is in this picture?".len()) as u64);
//!
//! // A media type the API does not take: 400, naming the field.
//! let error = MessagesRequest::parse(br#"{"model": "a/b", "messages": [{"role": "user", "content": [
//!     {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}}]}]}"#).unwrap_err();
//! assert_eq!(error.status(), 400);
//! assert_eq!(error.metadata()["param"], "messages[0].content[0].source.media_type");
//!
//! // A budget of the wrong type: 422.
//! let error = MessagesRequest::parse(br#"{"model": "a/b", "messages": [{"role": "user", "content": "Hi"}],
//!     "thinking": {"type": "enabled", "budget_tokens": "lots"}}"#).unwrap_err();
//! assert_eq!(error.status(), 422);
//! assert_eq!(error.metadata()["param"], "thinking.budget_tokens");
//! ```

use std::fmt;

use serde_json::{Map, Value};

use crate::error::GatewayError;
use crate::json_input::{
    At, bad_request, integer_at_least, invalid, json_bytes, number_in, request_body_fields,
    take_messages, take_model, take_stream, take_string,
};
use crate::model_id::{ModelId, ModelNames};

/// Which endpoint a Messages body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessagesEndpoint {
    /// `POST /v1/messages`: a model call.
    Create,
    /// `POST /v1/messages/count_tokens`: the prompt counted, nothing
    /// generated; the body has no `max_tokens` and no `stream`.
    CountTokens,
}

/// A Messages author's role: the API has two (system instructions are the
/// top-level `system`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessagesRole {
    /// `user`
    User,
    /// `assistant`
    Assistant,
    /// `system`: instructions among the turns, text only. Claude Code ends
    /// its requests with one; the top-level `system` stays the usual place.
    System,
}

impl MessagesRole {
    /// The role's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            MessagesRole::User => "user",
            MessagesRole::Assistant => "assistant",
            MessagesRole::System => "system",
        }
    }
}

impl fmt::Display for MessagesRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A message's content (and a tool result's, and a document's `content`
/// source): a string, or content blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum MessagesContent {
    /// Plain text.
    Text(String),
    /// Content blocks.
    Blocks(Vec<ContentBlock>),
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct InputMessage {
    /// Who wrote it.
    pub role: MessagesRole,
    /// What it says.
    pub content: MessagesContent,
    /// Every other field, kept as sent.
    pub extra: Map<String, Value>,
}

/// One content block: its kind and what the kind carries, its
/// `cache_control`, and its other fields as sent (`citations`, `title`,
/// `context`, a server tool block's fields, …).
#[derive(Clone, Debug, PartialEq)]
pub struct ContentBlock {
    /// The block's `type` and the fields the gateway reads.
    pub kind: BlockKind,
    /// A cache breakpoint on the block.
    pub cache_control: Option<CacheControl>,
    /// Every other field of the block, kept as sent.
    pub extra: Map<String, Value>,
}

/// What a content block is.
#[derive(Clone, Debug, PartialEq)]
pub enum BlockKind {
    /// `text`: its `text` (its `citations`, an array, stay in `extra`).
    Text {
        /// The text.
        text: String,
    },
    /// `image`, from a `base64`, `url` or `file` source.
    Image {
        /// Where the image is.
        source: MediaSource,
    },
    /// `document`: a PDF (`base64`, `url`, `file`), plain text (`text`) or
    /// content blocks (`content`).
    Document {
        /// Where the document is, or what it holds.
        source: MediaSource,
    },
    /// `tool_use`: a call of a tool by the model (assistant messages only).
    ToolUse {
        /// The call's id, which its `tool_result` names.
        id: String,
        /// The tool's name.
        name: String,
        /// The call's arguments.
        input: Map<String, Value>,
    },
    /// `tool_result`: what a called tool answered (user messages only).
    ToolResult {
        /// The `tool_use` block answered.
        tool_use_id: String,
        /// The answer, if any: a string or text, image and document blocks.
        content: Option<MessagesContent>,
        /// Whether the tool failed.
        is_error: Option<bool>,
    },
    /// `thinking`: the model's earlier reasoning (assistant messages only).
    Thinking {
        /// The reasoning's text.
        thinking: String,
        /// Anthropic's signature of it.
        signature: String,
    },
    /// `redacted_thinking`: reasoning sent back encrypted (assistant
    /// messages only).
    RedactedThinking {
        /// The encrypted reasoning.
        data: String,
    },
    /// Any other type, kept as sent with its fields in `extra`:
    /// `server_tool_use`, `web_search_tool_result`, `search_result`, and
    /// types newer than this gateway.
    Other {
        /// The block's `type`.
        kind: String,
    },
}

/// Where an image's or a document's content is.
#[derive(Clone, Debug, PartialEq)]
pub enum MediaSource {
    /// `base64`: the bytes inline.
    Base64 {
        /// `image/jpeg`, `image/png`, `image/gif`, `image/webp`; or
        /// `application/pdf` for a document.
        media_type: String,
        /// The bytes, base64-encoded.
        data: String,
    },
    /// `url`: fetched by the upstream.
    Url {
        /// The address.
        url: String,
    },
    /// `file`: uploaded earlier through the Files API.
    File {
        /// The file's id.
        file_id: String,
    },
    /// `text` (documents only): plain text inline.
    Text {
        /// `text/plain`.
        media_type: String,
        /// The text.
        data: String,
    },
    /// `content` (documents only): a string, or text and image blocks.
    Content {
        /// The document's content.
        content: MessagesContent,
    },
}

/// A cache breakpoint: `{"type": "ephemeral", "ttl": "5m" | "1h"}`. Other
/// fields (newer options such as `scope`) are kept as sent.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheControl {
    /// The `ttl` asked for; `None` is Anthropic's default, five minutes.
    pub ttl: Option<CacheTtl>,
    /// Every other field, kept as sent.
    pub extra: Map<String, Value>,
}

impl CacheControl {
    /// How long the cache entry lives: the `ttl`, else five minutes.
    pub fn lifetime(&self) -> CacheTtl {
        self.ttl.unwrap_or(CacheTtl::FiveMinutes)
    }
}

/// A cache entry's lifetime, which sets the price of writing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheTtl {
    /// `5m`
    FiveMinutes,
    /// `1h`
    OneHour,
}

impl CacheTtl {
    /// The lifetime as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheTtl::FiveMinutes => "5m",
            CacheTtl::OneHour => "1h",
        }
    }
}

/// The system prompt: a string, or text blocks (which may carry
/// `cache_control`).
#[derive(Clone, Debug, PartialEq)]
pub enum SystemPrompt {
    /// Plain text.
    Text(String),
    /// Text blocks, each a [`BlockKind::Text`].
    Blocks(Vec<ContentBlock>),
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct MessagesTool {
    /// What kind of tool, and the fields the gateway reads.
    pub kind: ToolKind,
    /// A cache breakpoint on the tool.
    pub cache_control: Option<CacheControl>,
    /// Every other field, kept as sent.
    pub extra: Map<String, Value>,
}

/// What a tool is.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolKind {
    /// A tool the client runs: no `type`, or `"custom"`.
    Custom {
        /// Its name.
        name: String,
        /// What it does, for the model.
        description: Option<String>,
        /// The JSON Schema of its input.
        input_schema: Map<String, Value>,
    },
    /// Anthropic's web search (`web_search_…`): each search has a fee, so
    /// it must say how many it may make.
    WebSearch {
        /// The versioned type, such as `web_search_20250305`.
        tool_type: String,
        /// The most searches the request may make.
        max_uses: u64,
    },
    /// Any other typed tool (`bash_…`, `text_editor_…`, `web_fetch_…`,
    /// `code_execution_…`, newer ones), kept as sent; its `max_uses`, when
    /// present, is checked to be a positive integer.
    Other {
        /// Its `type`.
        tool_type: String,
    },
}

/// How the model must use the tools: `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolChoice {
    /// Its `type`.
    pub kind: ToolChoiceKind,
    /// The tool to call, for [`ToolChoiceKind::Tool`] (and only there).
    pub name: Option<String>,
    /// At most one tool call per turn when true.
    pub disable_parallel_tool_use: Option<bool>,
    /// Every other field, kept as sent.
    pub extra: Map<String, Value>,
}

/// The `type` of a [`ToolChoice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolChoiceKind {
    /// `auto`: the model decides.
    Auto,
    /// `any`: the model calls some tool.
    Any,
    /// `none`: the model calls no tool.
    None,
    /// `tool`: the model calls the tool named.
    Tool,
}

/// Extended thinking: `thinking`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThinkingConfig {
    /// `{"type": "enabled", "budget_tokens": n}`: at least 1024, and less
    /// than `max_tokens` when that is given (thinking counts inside it).
    Enabled {
        /// The most tokens the model may think.
        budget_tokens: u64,
    },
    /// `{"type": "disabled"}`.
    Disabled,
    /// `{"type": "adaptive"}`: the model decides how much to think, within
    /// `max_tokens`.
    Adaptive,
}

/// What a prompt's hold is computed from: the prompt as the gateway can
/// measure it ([`MessagesRequest::prompt_size`]; a Responses request's,
/// [`ResponsesRequest::prompt_size`](super::ResponsesRequest::prompt_size),
/// counts its items as messages, its files as documents and its items and
/// parts of unknown types as unmeasured blocks). The field docs say what
/// a Messages request counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptSize {
    /// Bytes the upstream reads as text (at one token per byte, a bound of
    /// their tokens): the system prompt; each message's text, tool calls
    /// (id, name, input as JSON), tool results, thinking and redacted
    /// thinking, plain-text documents, `server_tool_use` blocks (as JSON)
    /// and the blocks' and messages' other fields (as JSON); every tool's
    /// definition (as JSON); the request's other top-level fields (as
    /// JSON). Thinking signatures, `metadata` and `cache_control` are not
    /// read by the model and are not counted.
    pub measured_bytes: u64,
    /// Images, wherever they are (messages, tool results, documents).
    pub image_count: u64,
    /// Documents the gateway cannot measure: PDFs (`base64`, `url`,
    /// `file`). Plain-text and content documents are measured instead.
    pub document_count: u64,
    /// Blocks of other types but `server_tool_use` (`web_search_tool_result`,
    /// `search_result`, newer ones): what they cost in tokens is not in
    /// their bytes, so a hold bounds them another way (a model's context
    /// length), as chat does with parts it does not know.
    pub unmeasured_block_count: u64,
    /// Messages in the conversation.
    pub message_count: u64,
    /// Tools whose definition the upstream expands itself (every tool but
    /// custom ones): their cost is not in their bytes either.
    pub server_tool_count: u64,
}

/// A parsed and validated Messages request (Anthropic's `POST /v1/messages`
/// body, or `count_tokens`').
///
/// The request's bytes reach the upstream unchanged; this is the gateway's
/// reading of them, for its own layers. What a hold needs:
/// [`prompt_size`](MessagesRequest::prompt_size), `max_tokens`,
/// [`thinking_budget_tokens`](MessagesRequest::thinking_budget_tokens)
/// (inside `max_tokens`), [`web_search_max_uses`](MessagesRequest::web_search_max_uses)
/// and [`longest_cache_ttl`](MessagesRequest::longest_cache_ttl).
#[derive(Clone, Debug, PartialEq)]
pub struct MessagesRequest {
    /// The endpoint the body was parsed for.
    pub endpoint: MessagesEndpoint,
    /// The model id, as the body names it (a bare id or an alias as the
    /// client sent it).
    pub model: String,
    /// The model the gateway chose: `model` parsed, or what the
    /// [`ModelNames`] of `BodyLimit` made of a
    /// bare id or alias. Prices, limits, quotas and records use this one.
    pub model_id: ModelId,
    /// The conversation; never empty.
    pub messages: Vec<InputMessage>,
    /// The system prompt.
    pub system: Option<SystemPrompt>,
    /// The most tokens the model may generate, thinking included; optional
    /// here, as OpenRouter makes it (never present for
    /// [`MessagesEndpoint::CountTokens`]).
    pub max_tokens: Option<u64>,
    /// Whether the response is streamed (SSE).
    pub stream: bool,
    /// Sampling temperature, 0 to 1.
    pub temperature: Option<f64>,
    /// Nucleus sampling, 0 to 1.
    pub top_p: Option<f64>,
    /// Sampling from the top k tokens only.
    pub top_k: Option<u64>,
    /// Texts that end generation.
    pub stop_sequences: Option<Vec<String>>,
    /// `metadata` (its `user_id`, when present, a string), as sent.
    pub metadata: Option<Map<String, Value>>,
    /// Tool definitions.
    pub tools: Option<Vec<MessagesTool>>,
    /// How the model must use the tools.
    pub tool_choice: Option<ToolChoice>,
    /// Extended thinking.
    pub thinking: Option<ThinkingConfig>,
    /// `service_tier`: `auto` or `standard_only`.
    pub service_tier: Option<String>,
    /// Every other top-level field, kept as sent.
    pub extra: Map<String, Value>,
}

impl MessagesRequest {
    /// Parses and validates the body of `POST /v1/messages`.
    ///
    /// 400 `invalid_request_error` for a body that is not a JSON object
    /// (with line and column when it is not JSON), a field named twice, a
    /// missing or empty `model` or `messages`, a missing field of a block,
    /// an unknown role, block type, source type, media type, cache `ttl`,
    /// `tool_choice` or `thinking` type or `service_tier`, a block in a
    /// role that may not hold it, and a web search tool without
    /// `max_uses`; 422 `invalid_parameter` for a field of the wrong type or
    /// out of range (`temperature` outside 0 to 1, `max_tokens` below 1, a
    /// thinking budget below 1024 or not below `max_tokens`). Each names
    /// its field's path in the message and in `metadata.param`.
    ///
    /// ```
    /// use modelgate::body::MessagesRequest;
    ///
    /// let request = MessagesRequest::parse(br#"{"model": "anthropic/claude-haiku-4.5", "max_tokens": 256,
    ///     "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
    /// assert_eq!(request.max_tokens, Some(256));
    ///
    /// let error = MessagesRequest::parse(br#"{"model": "a/b", "messages": [{"role": "tool", "content": "Hi"}]}"#).unwrap_err();
    /// assert_eq!(error.status(), 400);
    /// assert_eq!(error.metadata()["param"], "messages[0].role");
    /// ```
    pub fn parse(body: &[u8]) -> Result<MessagesRequest, GatewayError> {
        parse_request(body, MessagesEndpoint::Create, &ModelNames::new())
    }

    /// Parses and validates the body of `POST /v1/messages/count_tokens`:
    /// as [`MessagesRequest::parse`], but `max_tokens` and `stream` are not
    /// fields of a count (400 naming them).
    ///
    /// ```
    /// use modelgate::body::MessagesRequest;
    ///
    /// let body = br#"{"model": "a/b", "messages": [{"role": "user", "content": "Hi"}]}"#;
    /// assert!(MessagesRequest::parse_count_tokens(body).is_ok());
    /// let error = MessagesRequest::parse_count_tokens(br#"{"model": "a/b", "max_tokens": 5,
    ///     "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap_err();
    /// assert_eq!(error.metadata()["param"], "max_tokens");
    /// ```
    pub fn parse_count_tokens(body: &[u8]) -> Result<MessagesRequest, GatewayError> {
        parse_request(body, MessagesEndpoint::CountTokens, &ModelNames::new())
    }

    /// As [`MessagesRequest::parse`] or
    /// [`parse_count_tokens`](MessagesRequest::parse_count_tokens) for
    /// `endpoint`, a bare id or alias resolved by `names`.
    pub(crate) fn parse_named(
        body: &[u8],
        endpoint: MessagesEndpoint,
        names: &ModelNames,
    ) -> Result<MessagesRequest, GatewayError> {
        parse_request(body, endpoint, names)
    }

    /// The thinking budget, when thinking is enabled with one. It counts
    /// inside `max_tokens`, so it adds nothing to the completion bound.
    pub fn thinking_budget_tokens(&self) -> Option<u64> {
        match self.thinking {
            Some(ThinkingConfig::Enabled { budget_tokens }) => Some(budget_tokens),
            _ => None,
        }
    }

    /// The most web searches the request may make (each has a fee): the
    /// sum of its web search tools' `max_uses`; `None` without such a
    /// tool. [`MessagesRequest::parse`] refuses a web search tool without
    /// `max_uses`, so every search is bounded.
    pub fn web_search_max_uses(&self) -> Option<u64> {
        self.tools
            .iter()
            .flatten()
            .filter_map(|tool| match tool.kind {
                ToolKind::WebSearch { max_uses, .. } => Some(max_uses),
                _ => None,
            })
            .reduce(u64::saturating_add)
    }

    /// The longest cache lifetime any `cache_control` asks for (system
    /// blocks, tools, content blocks at any depth): the price at which the
    /// prompt may be written to the cache; `None` when nothing is cached.
    pub fn longest_cache_ttl(&self) -> Option<CacheTtl> {
        let mut longest = None;
        let mut note = |control: &Option<CacheControl>| {
            if let Some(control) = control {
                longest = longest.max(Some(control.lifetime()));
            }
        };
        for tool in self.tools.iter().flatten() {
            note(&tool.cache_control);
        }
        if let Some(SystemPrompt::Blocks(blocks)) = &self.system {
            visit_blocks(blocks, &mut |block| note(&block.cache_control));
        }
        for message in &self.messages {
            if let MessagesContent::Blocks(blocks) = &message.content {
                visit_blocks(blocks, &mut |block| note(&block.cache_control));
            }
        }
        longest
    }

    /// The prompt as the gateway can measure it, for its hold: see
    /// [`PromptSize`].
    pub fn prompt_size(&self) -> PromptSize {
        let mut size = PromptSize {
            message_count: self.messages.len() as u64,
            ..PromptSize::default()
        };
        match &self.system {
            Some(SystemPrompt::Text(text)) => size.add_bytes(text.len() as u64),
            Some(SystemPrompt::Blocks(blocks)) => size.add_blocks(blocks),
            None => {}
        }
        for message in &self.messages {
            size.add_content(&message.content);
            size.add_extra(&message.extra);
        }
        for tool in self.tools.iter().flatten() {
            match &tool.kind {
                ToolKind::Custom {
                    name,
                    description,
                    input_schema,
                } => {
                    size.add_bytes(name.len() as u64);
                    size.add_bytes(description.as_ref().map_or(0, |text| text.len() as u64));
                    size.add_bytes(json_bytes(input_schema));
                }
                ToolKind::WebSearch { .. } | ToolKind::Other { .. } => {
                    size.server_tool_count += 1;
                }
            }
            size.add_extra(&tool.extra);
        }
        size.add_extra(&self.extra);
        size
    }
}

impl PromptSize {
    pub(super) fn add_bytes(&mut self, bytes: u64) {
        self.measured_bytes = self.measured_bytes.saturating_add(bytes);
    }

    pub(super) fn add_extra(&mut self, extra: &Map<String, Value>) {
        if !extra.is_empty() {
            self.add_bytes(json_bytes(extra));
        }
    }

    fn add_content(&mut self, content: &MessagesContent) {
        match content {
            MessagesContent::Text(text) => self.add_bytes(text.len() as u64),
            MessagesContent::Blocks(blocks) => self.add_blocks(blocks),
        }
    }

    fn add_blocks(&mut self, blocks: &[ContentBlock]) {
        for block in blocks {
            self.add_block(block);
        }
    }

    fn add_block(&mut self, block: &ContentBlock) {
        match &block.kind {
            BlockKind::Text { text } => self.add_bytes(text.len() as u64),
            BlockKind::Image { .. } => self.image_count += 1,
            BlockKind::Document { source } => match source {
                MediaSource::Text { data, .. } => self.add_bytes(data.len() as u64),
                MediaSource::Content { content } => self.add_content(content),
                MediaSource::Base64 { .. } | MediaSource::Url { .. } | MediaSource::File { .. } => {
                    self.document_count += 1
                }
            },
            BlockKind::ToolUse { id, name, input } => {
                self.add_bytes((id.len() + name.len()) as u64);
                self.add_bytes(json_bytes(input));
            }
            BlockKind::ToolResult {
                tool_use_id,
                content,
                ..
            } => {
                self.add_bytes(tool_use_id.len() as u64);
                if let Some(content) = content {
                    self.add_content(content);
                }
            }
            BlockKind::Thinking { thinking, .. } => self.add_bytes(thinking.len() as u64),
            BlockKind::RedactedThinking { data } => self.add_bytes(data.len() as u64),
            // The model's own call of a server tool: its fields are the
            // text it wrote.
            BlockKind::Other { kind } if kind == "server_tool_use" => {}
            BlockKind::Other { .. } => {
                self.unmeasured_block_count += 1;
                // Its fields are not counted as text: the block is bounded
                // as a whole.
                return;
            }
        }
        self.add_extra(&block.extra);
    }
}

/// Calls `visit` on each block of `blocks` and on the blocks inside them
/// (tool results, content documents).
fn visit_blocks(blocks: &[ContentBlock], visit: &mut impl FnMut(&ContentBlock)) {
    for block in blocks {
        visit(block);
        let inner = match &block.kind {
            BlockKind::ToolResult {
                content: Some(MessagesContent::Blocks(inner)),
                ..
            } => inner,
            BlockKind::Document {
                source:
                    MediaSource::Content {
                        content: MessagesContent::Blocks(inner),
                    },
            } => inner,
            _ => continue,
        };
        visit_blocks(inner, visit);
    }
}

fn parse_request(
    body: &[u8],
    endpoint: MessagesEndpoint,
    names: &ModelNames,
) -> Result<MessagesRequest, GatewayError> {
    let mut fields = request_body_fields(body)?;
    let model = take_model(&mut fields)?;
    let messages = parse_messages(&mut fields)?;
    if endpoint == MessagesEndpoint::CountTokens {
        for name in ["max_tokens", "stream"] {
            if fields.contains_key(name) {
                return Err(bad_request(
                    name,
                    format!(
                        "`{name}` is not a field of a token count: send the body without it, or send it to /v1/messages"
                    ),
                ));
            }
        }
    }
    let system = parse_system(fields.remove("system"))?;
    let max_tokens = integer_at_least(fields.remove("max_tokens").as_ref(), "max_tokens", 1)?;
    let stream = take_stream(&mut fields)?;
    let temperature = number_in(
        fields.remove("temperature").as_ref(),
        "temperature",
        0.0,
        1.0,
    )?;
    let top_p = number_in(fields.remove("top_p").as_ref(), "top_p", 0.0, 1.0)?;
    let top_k = integer_at_least(fields.remove("top_k").as_ref(), "top_k", 0)?;
    let stop_sequences = parse_stop_sequences(fields.remove("stop_sequences"))?;
    let metadata = parse_metadata(fields.remove("metadata"))?;
    let tools = parse_tools(fields.remove("tools"))?;
    let tool_choice = parse_tool_choice(fields.remove("tool_choice"))?;
    let thinking = parse_thinking(fields.remove("thinking"), max_tokens)?;
    let service_tier = parse_service_tier(fields.remove("service_tier"))?;
    // Checked last, as chat does, so each other field's error reads the
    // same whatever the model; the limit layers need the parsed id.
    let model_id = names.resolve(&model)?;
    Ok(MessagesRequest {
        endpoint,
        model,
        model_id,
        messages,
        system,
        max_tokens,
        stream,
        temperature,
        top_p,
        top_k,
        stop_sequences,
        metadata,
        tools,
        tool_choice,
        thinking,
        service_tier,
        extra: fields,
    })
}

fn parse_messages(fields: &mut Map<String, Value>) -> Result<Vec<InputMessage>, GatewayError> {
    let at = At::Top("messages");
    take_messages(fields)?
        .into_iter()
        .enumerate()
        .map(|(index, message)| parse_message(&at.index(index), message))
        .collect()
}

fn parse_message(at: &At<'_>, message: Value) -> Result<InputMessage, GatewayError> {
    let Value::Object(mut fields) = message else {
        return Err(at.wrong_type("an object with `role` and `content`", &message));
    };
    let role_at = at.field("role");
    let role = match fields.remove("role") {
        Some(Value::String(name)) => match name.as_str() {
            "user" => MessagesRole::User,
            "assistant" => MessagesRole::Assistant,
            "system" => MessagesRole::System,
            other => return Err(role_at.unknown(other, "user, assistant or system")),
        },
        None | Some(Value::Null) => return Err(role_at.missing("user, assistant or system")),
        Some(other) => return Err(role_at.wrong_type("a string", &other)),
    };
    let place = match role {
        MessagesRole::User => Place::User,
        MessagesRole::Assistant => Place::Assistant,
        MessagesRole::System => Place::System,
    };
    let content_at = at.field("content");
    let content = match fields.remove("content") {
        Some(content) => parse_content(&content_at, content, place)?,
        None => return Err(content_at.missing("a string or an array of content blocks")),
    };
    Ok(InputMessage {
        role,
        content,
        extra: fields,
    })
}

/// Where a block stands, which decides the types it may have.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    User,
    Assistant,
    System,
    ToolResult,
    DocumentContent,
}

impl Place {
    /// Whether a block of type `kind` may stand here; else the reason, to
    /// end the refusal's message.
    fn allows(self, kind: &str) -> Result<(), &'static str> {
        match (self, kind) {
            (Place::System, "text") => Ok(()),
            (Place::System, _) => Err("the system prompt holds text blocks only"),
            (Place::DocumentContent, "text" | "image") => Ok(()),
            (Place::DocumentContent, _) => {
                Err("a document's content holds text and image blocks only")
            }
            (Place::ToolResult, "tool_use" | "tool_result" | "thinking" | "redacted_thinking") => {
                Err("a tool result holds text, image, document and search result blocks")
            }
            (Place::User, "tool_use" | "thinking" | "redacted_thinking") => {
                Err("only an assistant message may hold it")
            }
            (Place::Assistant, "tool_result") => Err("only a user message may hold it"),
            _ => Ok(()),
        }
    }
}

/// A string, or an array of blocks that may stand at `place`. Null is 400.
fn parse_content(
    at: &At<'_>,
    content: Value,
    place: Place,
) -> Result<MessagesContent, GatewayError> {
    match content {
        Value::String(text) => Ok(MessagesContent::Text(text)),
        Value::Array(blocks) => Ok(MessagesContent::Blocks(parse_blocks(at, blocks, place)?)),
        Value::Null => {
            let param = at.param();
            Err(bad_request(
                &param,
                format!("`{param}` must not be null: send a string or an array of content blocks"),
            ))
        }
        other => Err(at.wrong_type("a string or an array of content blocks", &other)),
    }
}

fn parse_blocks(
    at: &At<'_>,
    blocks: Vec<Value>,
    place: Place,
) -> Result<Vec<ContentBlock>, GatewayError> {
    blocks
        .into_iter()
        .enumerate()
        .map(|(index, block)| parse_block(&at.index(index), block, place))
        .collect()
}

fn parse_block(at: &At<'_>, block: Value, place: Place) -> Result<ContentBlock, GatewayError> {
    let Value::Object(mut fields) = block else {
        return Err(at.wrong_type("an object with a string `type`", &block));
    };
    let type_at = at.field("type");
    let kind = match fields.remove("type") {
        Some(Value::String(kind)) => kind,
        None | Some(Value::Null) => {
            return Err(type_at.missing("each content block is an object with a string `type`"));
        }
        Some(other) => return Err(type_at.wrong_type("a string", &other)),
    };
    if let Err(reason) = place.allows(&kind) {
        let param = type_at.param();
        return Err(bad_request(
            &param,
            format!("`{param}` is {kind:?}, which may not stand here: {reason}"),
        ));
    }
    let cache_control =
        parse_cache_control(&at.field("cache_control"), fields.remove("cache_control"))?;
    let kind = match kind.as_str() {
        "text" => {
            let text = take_string(&mut fields, at, "text")?;
            match fields.get("citations") {
                None | Some(Value::Null | Value::Array(_)) => {}
                Some(other) => return Err(at.field("citations").wrong_type("an array", other)),
            }
            BlockKind::Text { text }
        }
        "image" => BlockKind::Image {
            source: parse_source(at, &mut fields, Media::Image)?,
        },
        "document" => BlockKind::Document {
            source: parse_source(at, &mut fields, Media::Document)?,
        },
        "tool_use" => {
            let id = take_string(&mut fields, at, "id")?;
            let name = take_string(&mut fields, at, "name")?;
            let input_at = at.field("input");
            let input = match fields.remove("input") {
                Some(Value::Object(input)) => input,
                None | Some(Value::Null) => {
                    return Err(input_at.missing("the call's arguments, an object"));
                }
                Some(other) => return Err(input_at.wrong_type("an object", &other)),
            };
            BlockKind::ToolUse { id, name, input }
        }
        "tool_result" => {
            let tool_use_id = take_string(&mut fields, at, "tool_use_id")?;
            let content = match fields.remove("content") {
                None | Some(Value::Null) => None,
                Some(content) => Some(parse_content(
                    &at.field("content"),
                    content,
                    Place::ToolResult,
                )?),
            };
            let is_error = match fields.remove("is_error") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(is_error)) => Some(is_error),
                Some(other) => return Err(at.field("is_error").wrong_type("a boolean", &other)),
            };
            BlockKind::ToolResult {
                tool_use_id,
                content,
                is_error,
            }
        }
        "thinking" => BlockKind::Thinking {
            thinking: take_string(&mut fields, at, "thinking")?,
            signature: take_string(&mut fields, at, "signature")?,
        },
        "redacted_thinking" => BlockKind::RedactedThinking {
            data: take_string(&mut fields, at, "data")?,
        },
        _ => BlockKind::Other { kind },
    };
    Ok(ContentBlock {
        kind,
        cache_control,
        extra: fields,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Media {
    Image,
    Document,
}

const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// The `source` of the image or document block at `at`.
fn parse_source(
    at: &At<'_>,
    block: &mut Map<String, Value>,
    media: Media,
) -> Result<MediaSource, GatewayError> {
    let at = at.field("source");
    let mut source = match block.remove("source") {
        Some(Value::Object(source)) => source,
        None | Some(Value::Null) => return Err(at.missing("an object with a `type`")),
        Some(other) => return Err(at.wrong_type("an object", &other)),
    };
    let types = match media {
        Media::Image => "base64, url or file",
        Media::Document => "base64, text, content, url or file",
    };
    let kind = take_string(&mut source, &at, "type")?;
    match (kind.as_str(), media) {
        ("base64", _) => {
            let media_type = take_string(&mut source, &at, "media_type")?;
            let known = match media {
                Media::Image => IMAGE_MEDIA_TYPES.contains(&media_type.as_str()),
                Media::Document => media_type == "application/pdf",
            };
            if !known {
                let expected = match media {
                    Media::Image => "image/jpeg, image/png, image/gif or image/webp",
                    Media::Document => "application/pdf (or a `text` source for plain text)",
                };
                return Err(at.field("media_type").unknown(&media_type, expected));
            }
            let data = take_string(&mut source, &at, "data")?;
            Ok(MediaSource::Base64 { media_type, data })
        }
        ("url", _) => Ok(MediaSource::Url {
            url: take_string(&mut source, &at, "url")?,
        }),
        ("file", _) => Ok(MediaSource::File {
            file_id: take_string(&mut source, &at, "file_id")?,
        }),
        ("text", Media::Document) => {
            let media_type = take_string(&mut source, &at, "media_type")?;
            if media_type != "text/plain" {
                return Err(at.field("media_type").unknown(&media_type, "text/plain"));
            }
            let data = take_string(&mut source, &at, "data")?;
            Ok(MediaSource::Text { media_type, data })
        }
        ("content", Media::Document) => {
            let content_at = at.field("content");
            let content = match source.remove("content") {
                Some(content) => parse_content(&content_at, content, Place::DocumentContent)?,
                None => {
                    return Err(content_at.missing("a string or an array of text and image blocks"));
                }
            };
            Ok(MediaSource::Content { content })
        }
        (other, _) => Err(at.field("type").unknown(other, types)),
    }
}

/// `cache_control`: absent or null is none.
fn parse_cache_control(
    at: &At<'_>,
    value: Option<Value>,
) -> Result<Option<CacheControl>, GatewayError> {
    let mut fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(fields)) => fields,
        Some(other) => {
            return Err(at.wrong_type("an object such as {\"type\": \"ephemeral\"}", &other));
        }
    };
    let kind = take_string(&mut fields, at, "type")?;
    if kind != "ephemeral" {
        return Err(at.field("type").unknown(&kind, "\"ephemeral\""));
    }
    let ttl = match fields.remove("ttl") {
        None | Some(Value::Null) => None,
        Some(Value::String(ttl)) => match ttl.as_str() {
            "5m" => Some(CacheTtl::FiveMinutes),
            "1h" => Some(CacheTtl::OneHour),
            other => return Err(at.field("ttl").unknown(other, "\"5m\" or \"1h\"")),
        },
        Some(other) => return Err(at.field("ttl").wrong_type("a string", &other)),
    };
    Ok(Some(CacheControl { ttl, extra: fields }))
}

fn parse_system(system: Option<Value>) -> Result<Option<SystemPrompt>, GatewayError> {
    let at = At::Top("system");
    match system {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(SystemPrompt::Text(text))),
        Some(Value::Array(blocks)) => Ok(Some(SystemPrompt::Blocks(parse_blocks(
            &at,
            blocks,
            Place::System,
        )?))),
        Some(other) => Err(at.wrong_type("a string or an array of text blocks", &other)),
    }
}

fn parse_stop_sequences(value: Option<Value>) -> Result<Option<Vec<String>>, GatewayError> {
    let at = At::Top("stop_sequences");
    let sequences = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(sequences)) => sequences,
        Some(other) => return Err(at.wrong_type("an array of strings", &other)),
    };
    sequences
        .into_iter()
        .enumerate()
        .map(|(index, sequence)| match sequence {
            Value::String(sequence) => Ok(sequence),
            other => Err(at.index(index).wrong_type("a string", &other)),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

fn parse_metadata(value: Option<Value>) -> Result<Option<Map<String, Value>>, GatewayError> {
    let at = At::Top("metadata");
    let metadata = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(metadata)) => metadata,
        Some(other) => return Err(at.wrong_type("an object", &other)),
    };
    match metadata.get("user_id") {
        None | Some(Value::Null | Value::String(_)) => Ok(Some(metadata)),
        Some(other) => Err(at.field("user_id").wrong_type("a string", other)),
    }
}

fn parse_tools(value: Option<Value>) -> Result<Option<Vec<MessagesTool>>, GatewayError> {
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

fn parse_tool(at: &At<'_>, tool: Value) -> Result<MessagesTool, GatewayError> {
    let Value::Object(mut fields) = tool else {
        return Err(at.wrong_type("an object", &tool));
    };
    let tool_type = match fields.remove("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(kind)) => Some(kind),
        Some(other) => return Err(at.field("type").wrong_type("a string", &other)),
    };
    let cache_control =
        parse_cache_control(&at.field("cache_control"), fields.remove("cache_control"))?;
    let max_uses_at = at.field("max_uses");
    let max_uses = integer_at_least(fields.get("max_uses"), max_uses_at, 1)?;
    let kind = match tool_type {
        None => custom_tool(at, &mut fields)?,
        Some(kind) if kind == "custom" => {
            // Said explicitly, it stays as sent.
            fields.insert("type".to_owned(), Value::String(kind));
            custom_tool(at, &mut fields)?
        }
        Some(kind) if kind.starts_with("web_search_") => {
            let Some(max_uses) = max_uses else {
                let param = max_uses_at.param();
                return Err(bad_request(
                    &param,
                    format!(
                        "`{param}` is required for a web search tool: each search has a fee, and the gateway holds credit for at most `max_uses` searches; set it to the most searches the request may make"
                    ),
                ));
            };
            fields.remove("max_uses");
            ToolKind::WebSearch {
                tool_type: kind,
                max_uses,
            }
        }
        Some(kind) => ToolKind::Other { tool_type: kind },
    };
    Ok(MessagesTool {
        kind,
        cache_control,
        extra: fields,
    })
}

fn custom_tool(at: &At<'_>, fields: &mut Map<String, Value>) -> Result<ToolKind, GatewayError> {
    let name = take_string(fields, at, "name")?;
    if name.is_empty() {
        let param = at.field("name").param();
        return Err(bad_request(&param, format!("`{param}` must not be empty")));
    }
    let description = match fields.remove("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(description)) => Some(description),
        Some(other) => return Err(at.field("description").wrong_type("a string", &other)),
    };
    let schema_at = at.field("input_schema");
    let input_schema = match fields.remove("input_schema") {
        Some(Value::Object(schema)) => schema,
        None | Some(Value::Null) => {
            return Err(schema_at.missing("the JSON Schema of the tool's input, an object"));
        }
        Some(other) => return Err(schema_at.wrong_type("an object", &other)),
    };
    Ok(ToolKind::Custom {
        name,
        description,
        input_schema,
    })
}

fn parse_tool_choice(value: Option<Value>) -> Result<Option<ToolChoice>, GatewayError> {
    let at = At::Top("tool_choice");
    let mut fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(fields)) => fields,
        Some(other) => return Err(at.wrong_type("an object such as {\"type\": \"auto\"}", &other)),
    };
    let kind = take_string(&mut fields, &at, "type")?;
    let kind = match kind.as_str() {
        "auto" => ToolChoiceKind::Auto,
        "any" => ToolChoiceKind::Any,
        "none" => ToolChoiceKind::None,
        "tool" => ToolChoiceKind::Tool,
        other => return Err(at.field("type").unknown(other, "auto, any, none or tool")),
    };
    let name = match fields.remove("name") {
        None | Some(Value::Null) if kind == ToolChoiceKind::Tool => {
            return Err(at
                .field("name")
                .missing("the tool to call, when `tool_choice.type` is \"tool\""));
        }
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if kind == ToolChoiceKind::Tool => Some(name),
        Some(Value::String(_)) => {
            return Err(bad_request(
                "tool_choice.name",
                "`tool_choice.name` names a tool only when `tool_choice.type` is \"tool\"",
            ));
        }
        Some(other) => return Err(at.field("name").wrong_type("a string", &other)),
    };
    let disable_parallel_tool_use = match fields.remove("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(disable)) => Some(disable),
        Some(other) => {
            return Err(at
                .field("disable_parallel_tool_use")
                .wrong_type("a boolean", &other));
        }
    };
    Ok(Some(ToolChoice {
        kind,
        name,
        disable_parallel_tool_use,
        extra: fields,
    }))
}

/// The least thinking budget Anthropic takes.
const MIN_THINKING_BUDGET_TOKENS: u64 = 1024;

fn parse_thinking(
    value: Option<Value>,
    max_tokens: Option<u64>,
) -> Result<Option<ThinkingConfig>, GatewayError> {
    let at = At::Top("thinking");
    let mut fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(fields)) => fields,
        Some(other) => {
            return Err(at.wrong_type(
                "an object such as {\"type\": \"enabled\", \"budget_tokens\": 2048}",
                &other,
            ));
        }
    };
    let kind = take_string(&mut fields, &at, "type")?;
    match kind.as_str() {
        "enabled" => {
            let budget_at = at.field("budget_tokens");
            let Some(budget_tokens) = integer_at_least(
                fields.get("budget_tokens"),
                budget_at,
                MIN_THINKING_BUDGET_TOKENS,
            )?
            else {
                return Err(budget_at.missing("the most tokens the model may think, at least 1024"));
            };
            if let Some(max_tokens) = max_tokens
                && budget_tokens >= max_tokens
            {
                return Err(invalid(
                    &budget_at.param(),
                    &format!(
                        "must be less than `max_tokens` ({max_tokens}), not {budget_tokens}: thinking counts inside `max_tokens`"
                    ),
                ));
            }
            Ok(Some(ThinkingConfig::Enabled { budget_tokens }))
        }
        "disabled" => Ok(Some(ThinkingConfig::Disabled)),
        "adaptive" => Ok(Some(ThinkingConfig::Adaptive)),
        other => Err(at
            .field("type")
            .unknown(other, "enabled, disabled or adaptive")),
    }
}

fn parse_service_tier(value: Option<Value>) -> Result<Option<String>, GatewayError> {
    let at = At::Top("service_tier");
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(tier)) if tier == "auto" || tier == "standard_only" => Ok(Some(tier)),
        Some(Value::String(tier)) => Err(at.unknown(&tier, "auto or standard_only")),
        Some(other) => Err(at.wrong_type("a string", &other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(value: &Value) -> Result<MessagesRequest, GatewayError> {
        MessagesRequest::parse(value.to_string().as_bytes())
    }

    fn minimal() -> Value {
        json!({"model": "anthropic/claude-sonnet-4.5", "messages": [{"role": "user", "content": "Hi"}]})
    }

    fn with(field: &str, value: Value) -> Value {
        let mut request = minimal();
        request[field] = value;
        request
    }

    /// The minimal request whose user message is this one block.
    fn user_block(block: Value) -> Value {
        with("messages", json!([{"role": "user", "content": [block]}]))
    }

    /// A user turn, then an assistant turn of this one block.
    fn assistant_block(block: Value) -> Value {
        with(
            "messages",
            json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [block]}]),
        )
    }

    /// The body Claude Code sends, shortened: cached system blocks, custom
    /// tools with strict schemas, a web search tool, thinking, a tool
    /// round trip with a cached tool result, metadata.
    fn claude_code() -> Value {
        json!({
            "model": "anthropic/claude-sonnet-4.5",
            "max_tokens": 32000,
            "stream": true,
            "temperature": 1,
            "metadata": {"user_id": "user_3f2a_account__session_9c1d"},
            "system": [
                {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ],
            "tools": [
                {"name": "Bash", "description": "Executes a given bash command.", "input_schema": {
                    "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
                    "required": ["command"], "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}},
                {"name": "Read", "description": "Reads a file.", "input_schema": {
                    "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
                    "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
            ],
            "tool_choice": {"type": "auto"},
            "thinking": {"type": "enabled", "budget_tokens": 31999},
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "<system-reminder>Use the tools.</system-reminder>"},
                    {"type": "text", "text": "List the files.", "cache_control": {"type": "ephemeral"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should run ls.", "signature": "EqQBCkYIBxgCKkA"},
                    {"type": "text", "text": "Listing."},
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Cargo.toml\nsrc", "is_error": false,
                     "cache_control": {"type": "ephemeral"}}
                ]}
            ],
            "context_management": {"edits": []}
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

    /// Claude Code ends its requests with a system message after the
    /// user's turn: taken, measured for the hold like any other text.
    #[test]
    fn a_system_message_among_the_turns_is_taken_and_measured() {
        let request = MessagesRequest::parse(
            br#"{"model": "a/b", "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "system", "content": [{"type": "text", "text": "Reminder: be brief."}]}]}"#,
        )
        .unwrap();
        assert_eq!(request.messages[1].role, MessagesRole::System);
        let size = request.prompt_size();
        assert_eq!(size.message_count, 2);
        assert!(size.measured_bytes >= ("Hi".len() + "Reminder: be brief.".len()) as u64);
    }

    #[test]
    fn a_claude_code_body_parses_with_every_field_read() {
        let request = parse(&claude_code()).unwrap();
        assert_eq!(request.endpoint, MessagesEndpoint::Create);
        assert_eq!(request.model_id.as_str(), "anthropic/claude-sonnet-4.5");
        assert_eq!(request.max_tokens, Some(32000));
        assert!(request.stream);
        assert_eq!(request.temperature, Some(1.0));
        assert_eq!(request.thinking_budget_tokens(), Some(31999));
        assert_eq!(request.web_search_max_uses(), Some(5));
        assert_eq!(request.longest_cache_ttl(), Some(CacheTtl::OneHour));
        assert_eq!(
            request.metadata.as_ref().unwrap()["user_id"],
            "user_3f2a_account__session_9c1d"
        );
        assert_eq!(
            request.tool_choice.as_ref().unwrap().kind,
            ToolChoiceKind::Auto
        );
        assert_eq!(
            request.extra.keys().collect::<Vec<_>>(),
            ["context_management"]
        );
        let Some(SystemPrompt::Blocks(system)) = &request.system else {
            panic!("system blocks")
        };
        assert_eq!(
            system[1].cache_control.as_ref().unwrap().ttl,
            Some(CacheTtl::OneHour)
        );
        assert_eq!(
            system[0].cache_control.as_ref().unwrap().lifetime(),
            CacheTtl::FiveMinutes
        );
        let tools = request.tools.as_ref().unwrap();
        assert!(
            matches!(&tools[0].kind, ToolKind::Custom { name, input_schema, .. }
            if name == "Bash" && input_schema["required"] == json!(["command"]))
        );
        assert_eq!(
            tools[2].kind,
            ToolKind::WebSearch {
                tool_type: "web_search_20250305".into(),
                max_uses: 5
            }
        );
        assert_eq!(tools[2].extra["name"], "web_search");
        let roles: Vec<_> = request
            .messages
            .iter()
            .map(|message| message.role)
            .collect();
        assert_eq!(
            roles,
            [
                MessagesRole::User,
                MessagesRole::Assistant,
                MessagesRole::User
            ]
        );
        let MessagesContent::Blocks(blocks) = &request.messages[1].content else {
            panic!("blocks")
        };
        assert_eq!(
            blocks[0].kind,
            BlockKind::Thinking {
                thinking: "I should run ls.".into(),
                signature: "EqQBCkYIBxgCKkA".into(),
            }
        );
        assert!(
            matches!(&blocks[2].kind, BlockKind::ToolUse { id, input, .. }
            if id == "toolu_01" && input["command"] == "ls")
        );
        let MessagesContent::Blocks(blocks) = &request.messages[2].content else {
            panic!("blocks")
        };
        assert_eq!(
            blocks[0].kind,
            BlockKind::ToolResult {
                tool_use_id: "toolu_01".into(),
                content: Some(MessagesContent::Text("Cargo.toml\nsrc".into())),
                is_error: Some(false),
            }
        );
        // The same body is a token count without its two fields.
        let mut count = claude_code();
        let fields = count.as_object_mut().unwrap();
        fields.remove("max_tokens");
        fields.remove("stream");
        let request = MessagesRequest::parse_count_tokens(count.to_string().as_bytes()).unwrap();
        assert_eq!(request.endpoint, MessagesEndpoint::CountTokens);
        assert_eq!((request.max_tokens, request.stream), (None, false));
        // Without max_tokens the budget has nothing to stay under.
        assert_eq!(request.thinking_budget_tokens(), Some(31999));
    }

    #[test]
    fn every_block_kind_and_source_is_read() {
        let body = with(
            "messages",
            json!([
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                    {"type": "image", "source": {"type": "url", "url": "https://e.x/a.jpg"}},
                    {"type": "image", "source": {"type": "file", "file_id": "file_1"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}, "title": "T"},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"}, "citations": {"enabled": true}},
                    {"type": "document", "source": {"type": "content", "content": [
                        {"type": "text", "text": "chunk"},
                        {"type": "image", "source": {"type": "url", "url": "https://e.x/b.png"}}]}},
                    {"type": "document", "source": {"type": "url", "url": "https://e.x/a.pdf"}},
                    {"type": "search_result", "source": "https://e.x", "title": "r", "content": [{"type": "text", "text": "r"}]}
                ]},
                {"role": "assistant", "content": [
                    {"type": "redacted_thinking", "data": "ENCRYPTED"},
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [{"type": "web_search_result", "url": "u", "title": "t", "encrypted_content": "E"}]},
                    {"type": "text", "text": "Found.", "citations": [{"type": "web_search_result_location", "url": "u"}]}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": true, "content": [
                        {"type": "text", "text": "failed"},
                        {"type": "image", "source": {"type": "url", "url": "https://e.x/c.png"}, "cache_control": {"type": "ephemeral", "ttl": "5m"}}]},
                    {"type": "tool_result", "tool_use_id": "t2"}
                ]}
            ]),
        );
        let request = parse(&body).unwrap();
        let blocks = |index: usize| match &request.messages[index].content {
            MessagesContent::Blocks(blocks) => blocks.clone(),
            MessagesContent::Text(_) => panic!("blocks"),
        };
        let user = blocks(0);
        assert_eq!(
            user[0].kind,
            BlockKind::Image {
                source: MediaSource::Base64 {
                    media_type: "image/png".into(),
                    data: "iVBO".into()
                },
            }
        );
        assert_eq!(
            user[2].kind,
            BlockKind::Image {
                source: MediaSource::File {
                    file_id: "file_1".into()
                }
            }
        );
        assert_eq!(user[3].extra["title"], "T");
        assert_eq!(
            user[4].kind,
            BlockKind::Document {
                source: MediaSource::Text {
                    media_type: "text/plain".into(),
                    data: "plain".into()
                },
            }
        );
        assert!(
            matches!(&user[5].kind, BlockKind::Document { source: MediaSource::Content { content: MessagesContent::Blocks(inner) } } if inner.len() == 2)
        );
        assert_eq!(
            user[7].kind,
            BlockKind::Other {
                kind: "search_result".into()
            }
        );
        let assistant = blocks(1);
        assert_eq!(
            assistant[0].kind,
            BlockKind::RedactedThinking {
                data: "ENCRYPTED".into()
            }
        );
        assert_eq!(
            assistant[1].kind,
            BlockKind::Other {
                kind: "server_tool_use".into()
            }
        );
        assert_eq!(assistant[1].extra["input"], json!({"query": "q"}));
        assert_eq!(
            assistant[2].kind,
            BlockKind::Other {
                kind: "web_search_tool_result".into()
            }
        );
        assert!(assistant[3].extra["citations"].is_array());
        let results = blocks(2);
        assert!(
            matches!(&results[0].kind, BlockKind::ToolResult { is_error: Some(true), content: Some(MessagesContent::Blocks(inner)), .. } if inner.len() == 2)
        );
        assert_eq!(
            results[1].kind,
            BlockKind::ToolResult {
                tool_use_id: "t2".into(),
                content: None,
                is_error: None
            }
        );
        assert_eq!(request.longest_cache_ttl(), Some(CacheTtl::FiveMinutes));
        assert_eq!(parse(&minimal()).unwrap().longest_cache_ttl(), None);

        let size = request.prompt_size();
        // Images: three in the user turn, one in the content document, one in
        // a tool result. PDFs: base64 and url. Unmeasured: the search
        // result and the web search result.
        assert_eq!(
            (
                size.image_count,
                size.document_count,
                size.unmeasured_block_count,
                size.message_count
            ),
            (5, 2, 2, 3)
        );
        let extra = |value: Value| json_bytes(&value);
        let expected = extra(json!({"title": "T"}))
            + "plain".len() as u64
            + extra(json!({"citations": {"enabled": true}}))
            + "chunk".len() as u64
            + "ENCRYPTED".len() as u64
            + extra(json!({"id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}}))
            + "Found.".len() as u64
            + extra(json!({"citations": [{"type": "web_search_result_location", "url": "u"}]}))
            + "t1failed".len() as u64
            + "t2".len() as u64;
        assert_eq!(size.measured_bytes, expected);
    }

    #[test]
    fn the_prompt_size_counts_system_tools_calls_and_extras() {
        let body = json!({
            "model": "a/b",
            "system": "sys",
            "messages": [
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "not counted"},
                    {"type": "tool_use", "id": "i", "name": "n", "input": {"k": 1}}]}
            ],
            "tools": [
                {"name": "t", "description": "dd", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
                {"type": "bash_20250124", "name": "bash"}
            ],
            "metadata": {"user_id": "not counted"},
            "mcp_servers": []
        });
        let size = parse(&body).unwrap().prompt_size();
        let expected = 3
            + 5
            + 3
            + 2
            + json_bytes(&json!({"k": 1}))
            + 1
            + 2
            + json_bytes(&json!({"type": "object"}))
            + json_bytes(&json!({"name": "bash"}))
            + json_bytes(&json!({"mcp_servers": []}));
        assert_eq!(
            size,
            PromptSize {
                measured_bytes: expected,
                image_count: 0,
                document_count: 0,
                unmeasured_block_count: 0,
                message_count: 2,
                server_tool_count: 1,
            }
        );
    }

    #[test]
    fn what_is_missing_empty_or_unknown_is_a_400_naming_it() {
        let mut no_model = minimal();
        no_model.as_object_mut().unwrap().remove("model");
        let mut no_messages = minimal();
        no_messages.as_object_mut().unwrap().remove("messages");
        let image = |source: Value| user_block(json!({"type": "image", "source": source}));
        let document = |source: Value| user_block(json!({"type": "document", "source": source}));
        let cases: Vec<(Value, &str, &str)> = vec![
            (no_model, "model", "`model` is required"),
            (with("model", json!(" ")), "model", "must not be empty"),
            (with("model", json!(null)), "model", "is required"),
            (no_messages, "messages", "`messages` is required"),
            (
                with("messages", json!([])),
                "messages",
                "at least one message",
            ),
            (
                with("messages", json!([{"content": "x"}])),
                "messages[0].role",
                "is required",
            ),
            (
                with("messages", json!([{"role": "tool", "content": "x"}])),
                "messages[0].role",
                "\"tool\"",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": "x"},
                           {"role": "system", "content": [{"type": "image",
                               "source": {"type": "url", "url": "https://example.com/a.png"}}]}]),
                ),
                "messages[1].content[0].type",
                "text blocks only",
            ),
            (
                with("messages", json!([{"role": "user"}])),
                "messages[0].content",
                "is required",
            ),
            (
                with("messages", json!([{"role": "user", "content": null}])),
                "messages[0].content",
                "must not be null",
            ),
            (
                user_block(json!({"text": "x"})),
                "messages[0].content[0].type",
                "is required",
            ),
            (
                user_block(json!({"type": "text"})),
                "messages[0].content[0].text",
                "is required",
            ),
            (
                user_block(json!({"type": "image"})),
                "messages[0].content[0].source",
                "is required",
            ),
            (
                image(json!({"url": "u"})),
                "messages[0].content[0].source.type",
                "is required",
            ),
            (
                image(json!({"type": "text", "media_type": "text/plain", "data": "x"})),
                "messages[0].content[0].source.type",
                "base64, url or file",
            ),
            (
                image(json!({"type": "base64", "media_type": "image/bmp", "data": "x"})),
                "messages[0].content[0].source.media_type",
                "\"image/bmp\"",
            ),
            (
                image(json!({"type": "base64", "media_type": "image/png"})),
                "messages[0].content[0].source.data",
                "is required",
            ),
            (
                image(json!({"type": "url"})),
                "messages[0].content[0].source.url",
                "is required",
            ),
            (
                image(json!({"type": "file"})),
                "messages[0].content[0].source.file_id",
                "is required",
            ),
            (
                document(json!({"type": "base64", "media_type": "image/png", "data": "x"})),
                "messages[0].content[0].source.media_type",
                "application/pdf",
            ),
            (
                document(json!({"type": "text", "media_type": "text/html", "data": "x"})),
                "messages[0].content[0].source.media_type",
                "text/plain",
            ),
            (
                document(json!({"type": "content"})),
                "messages[0].content[0].source.content",
                "is required",
            ),
            (
                document(
                    json!({"type": "content", "content": [{"type": "document", "source": {"type": "url", "url": "u"}}]}),
                ),
                "messages[0].content[0].source.content[0].type",
                "text and image blocks only",
            ),
            (
                document(json!({"type": "zip"})),
                "messages[0].content[0].source.type",
                "base64, text, content, url or file",
            ),
            (
                user_block(json!({"type": "tool_use", "id": "i", "name": "n", "input": {}})),
                "messages[0].content[0].type",
                "only an assistant message",
            ),
            (
                user_block(json!({"type": "thinking", "thinking": "t", "signature": "s"})),
                "messages[0].content[0].type",
                "only an assistant message",
            ),
            (
                user_block(json!({"type": "redacted_thinking", "data": "d"})),
                "messages[0].content[0].type",
                "only an assistant message",
            ),
            (
                assistant_block(json!({"type": "tool_result", "tool_use_id": "t"})),
                "messages[1].content[0].type",
                "only a user message",
            ),
            (
                assistant_block(json!({"type": "tool_use", "name": "n", "input": {}})),
                "messages[1].content[0].id",
                "is required",
            ),
            (
                assistant_block(json!({"type": "tool_use", "id": "i", "input": {}})),
                "messages[1].content[0].name",
                "is required",
            ),
            (
                assistant_block(json!({"type": "tool_use", "id": "i", "name": "n"})),
                "messages[1].content[0].input",
                "is required",
            ),
            (
                assistant_block(json!({"type": "thinking", "thinking": "t"})),
                "messages[1].content[0].signature",
                "is required",
            ),
            (
                assistant_block(json!({"type": "redacted_thinking"})),
                "messages[1].content[0].data",
                "is required",
            ),
            (
                user_block(json!({"type": "tool_result"})),
                "messages[0].content[0].tool_use_id",
                "is required",
            ),
            (
                user_block(
                    json!({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_use", "id": "i", "name": "n", "input": {}}]}),
                ),
                "messages[0].content[0].content[0].type",
                "a tool result holds",
            ),
            (
                user_block(json!({"type": "text", "text": "x", "cache_control": {}})),
                "messages[0].content[0].cache_control.type",
                "is required",
            ),
            (
                user_block(
                    json!({"type": "text", "text": "x", "cache_control": {"type": "persistent"}}),
                ),
                "messages[0].content[0].cache_control.type",
                "\"persistent\"",
            ),
            (
                user_block(
                    json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}),
                ),
                "messages[0].content[0].cache_control.ttl",
                "\"5m\" or \"1h\"",
            ),
            (
                with(
                    "system",
                    json!([{"type": "image", "source": {"type": "url", "url": "u"}}]),
                ),
                "system[0].type",
                "text blocks only",
            ),
            (
                with(
                    "system",
                    json!([{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1d"}}]),
                ),
                "system[0].cache_control.ttl",
                "\"1d\"",
            ),
            (
                with("tools", json!([{"input_schema": {}}])),
                "tools[0].name",
                "is required",
            ),
            (
                with("tools", json!([{"name": "", "input_schema": {}}])),
                "tools[0].name",
                "must not be empty",
            ),
            (
                with("tools", json!([{"name": "n"}])),
                "tools[0].input_schema",
                "is required",
            ),
            (
                with("tools", json!([{"type": "custom", "name": "n"}])),
                "tools[0].input_schema",
                "is required",
            ),
            (
                with(
                    "tools",
                    json!([{"name": "n", "input_schema": {}, "cache_control": {"type": "x"}}]),
                ),
                "tools[0].cache_control.type",
                "\"x\"",
            ),
            (
                with(
                    "tools",
                    json!([{"name": "n", "input_schema": {}}, {"type": "web_search_20250305", "name": "web_search"}]),
                ),
                "tools[1].max_uses",
                "web search tool",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "web_search_20260209", "name": "web_search", "max_uses": null}]),
                ),
                "tools[0].max_uses",
                "is required",
            ),
            (
                with("tool_choice", json!({})),
                "tool_choice.type",
                "is required",
            ),
            (
                with("tool_choice", json!({"type": "required"})),
                "tool_choice.type",
                "auto, any, none or tool",
            ),
            (
                with("tool_choice", json!({"type": "tool"})),
                "tool_choice.name",
                "is required",
            ),
            (
                with("tool_choice", json!({"type": "auto", "name": "Bash"})),
                "tool_choice.name",
                "only when",
            ),
            (with("thinking", json!({})), "thinking.type", "is required"),
            (
                with("thinking", json!({"type": "on"})),
                "thinking.type",
                "enabled, disabled or adaptive",
            ),
            (
                with("thinking", json!({"type": "enabled"})),
                "thinking.budget_tokens",
                "is required",
            ),
            (
                with("service_tier", json!("priority")),
                "service_tier",
                "auto or standard_only",
            ),
        ];
        for (body, param, words) in cases {
            let (status, found, message) = refusal(&body);
            assert_eq!((status, found.as_str()), (400, param), "{body}: {message}");
            assert!(message.contains(words), "{body}: {message}");
            assert!(message.contains(&format!("`{param}`")), "{message}");
            assert_eq!(parse(&body).unwrap_err().kind(), ErrorKind::InvalidRequest);
        }
    }

    #[test]
    fn the_body_must_be_one_json_object_with_each_field_once() {
        let error = MessagesRequest::parse(
            br#"{"model": "a/b:free", "messages": [{"role": "user", "content": "x"}], "model": "a/b"}"#,
        )
        .unwrap_err();
        assert_eq!(
            (error.status().as_u16(), &error.metadata()["param"]),
            (400, &json!("model"))
        );
        assert!(
            error.message().contains("duplicate field `model`"),
            "{}",
            error.message()
        );
        let error = MessagesRequest::parse(b"[1]").unwrap_err();
        assert!(
            error
                .message()
                .contains("must be a JSON object, not an array")
        );
        let error = MessagesRequest::parse(b"{\"model\": ").unwrap_err();
        assert!(
            error.message().contains("line 1, column 10"),
            "{}",
            error.message()
        );
        // The model's syntax is checked last, after every other field.
        let error = parse(&json!({"model": "no-slash", "messages": []})).unwrap_err();
        assert_eq!(error.metadata()["param"], "messages");
        let error = parse(&with("model", json!("no-slash"))).unwrap_err();
        assert_eq!(
            (error.status().as_u16(), &error.metadata()["param"]),
            (400, &json!("model"))
        );
    }

    #[test]
    fn a_token_count_takes_no_max_tokens_nor_stream() {
        for (field, value) in [
            ("max_tokens", json!(10)),
            ("stream", json!(false)),
            ("stream", json!(null)),
        ] {
            let error =
                MessagesRequest::parse_count_tokens(with(field, value).to_string().as_bytes())
                    .unwrap_err();
            assert_eq!(
                (error.status().as_u16(), &error.metadata()["param"]),
                (400, &json!(field))
            );
            assert!(
                error.message().contains("token count"),
                "{}",
                error.message()
            );
        }
        assert!(parse(&with("stream", json!(null))).is_ok());
    }

    #[test]
    fn wrong_types_and_values_out_of_range_are_a_422_naming_them() {
        let block = |block: Value| user_block(block);
        let cases: Vec<(Value, &str, &str)> = vec![
            (
                with("model", json!(5)),
                "model",
                "must be a string, not a number",
            ),
            (
                with("messages", json!("hi")),
                "messages",
                "must be an array, not a string",
            ),
            (
                with("messages", json!(["hi"])),
                "messages[0]",
                "must be an object",
            ),
            (
                with("messages", json!([{"role": 1, "content": "x"}])),
                "messages[0].role",
                "must be a string",
            ),
            (
                with("messages", json!([{"role": "user", "content": 5}])),
                "messages[0].content",
                "a string or an array of content blocks",
            ),
            (
                block(json!("x")),
                "messages[0].content[0]",
                "must be an object",
            ),
            (
                block(json!({"type": 3})),
                "messages[0].content[0].type",
                "must be a string",
            ),
            (
                block(json!({"type": "text", "text": 3})),
                "messages[0].content[0].text",
                "must be a string",
            ),
            (
                block(json!({"type": "text", "text": "x", "citations": "all"})),
                "messages[0].content[0].citations",
                "must be an array",
            ),
            (
                block(json!({"type": "text", "text": "x", "cache_control": "ephemeral"})),
                "messages[0].content[0].cache_control",
                "must be an object",
            ),
            (
                block(
                    json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": 3600}}),
                ),
                "messages[0].content[0].cache_control.ttl",
                "must be a string",
            ),
            (
                block(json!({"type": "image", "source": "https://e.x"})),
                "messages[0].content[0].source",
                "must be an object",
            ),
            (
                block(
                    json!({"type": "image", "source": {"type": "base64", "media_type": ["image/png"], "data": "x"}}),
                ),
                "messages[0].content[0].source.media_type",
                "must be a string, not an array",
            ),
            (
                block(
                    json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": 1}}),
                ),
                "messages[0].content[0].source.data",
                "must be a string",
            ),
            (
                block(json!({"type": "document", "source": {"type": "content", "content": 1}})),
                "messages[0].content[0].source.content",
                "must be a string or an array",
            ),
            (
                block(json!({"type": "tool_result", "tool_use_id": 1})),
                "messages[0].content[0].tool_use_id",
                "must be a string",
            ),
            (
                block(json!({"type": "tool_result", "tool_use_id": "t", "content": {}})),
                "messages[0].content[0].content",
                "must be a string or an array",
            ),
            (
                block(json!({"type": "tool_result", "tool_use_id": "t", "is_error": "no"})),
                "messages[0].content[0].is_error",
                "must be a boolean",
            ),
            (
                assistant_block(json!({"type": "tool_use", "id": "i", "name": "n", "input": "ls"})),
                "messages[1].content[0].input",
                "must be an object",
            ),
            (
                assistant_block(json!({"type": "thinking", "thinking": null, "signature": "s"})),
                "messages[1].content[0].thinking",
                "is required",
            ),
            (
                with("system", json!(5)),
                "system",
                "a string or an array of text blocks",
            ),
            (
                with("system", json!([{"type": "text", "text": 5}])),
                "system[0].text",
                "must be a string",
            ),
            (
                with("max_tokens", json!(0)),
                "max_tokens",
                "at least 1, not 0",
            ),
            (with("max_tokens", json!(-3)), "max_tokens", "at least 1"),
            (with("max_tokens", json!(1.5)), "max_tokens", "at least 1"),
            (
                with("max_tokens", json!("1024")),
                "max_tokens",
                "must be an integer, not a string",
            ),
            (with("stream", json!("yes")), "stream", "must be a boolean"),
            (
                with("temperature", json!(1.5)),
                "temperature",
                "between 0 and 1",
            ),
            (
                with("temperature", json!(-0.1)),
                "temperature",
                "between 0 and 1",
            ),
            (with("top_p", json!(2)), "top_p", "between 0 and 1"),
            (with("top_k", json!(-1)), "top_k", "at least 0"),
            (with("top_k", json!("5")), "top_k", "must be an integer"),
            (
                with("stop_sequences", json!("END")),
                "stop_sequences",
                "an array of strings",
            ),
            (
                with("stop_sequences", json!(["END", 1])),
                "stop_sequences[1]",
                "must be a string",
            ),
            (with("metadata", json!([])), "metadata", "must be an object"),
            (
                with("metadata", json!({"user_id": 5})),
                "metadata.user_id",
                "must be a string",
            ),
            (with("tools", json!({})), "tools", "must be an array"),
            (
                with("tools", json!(["Bash"])),
                "tools[0]",
                "must be an object",
            ),
            (
                with("tools", json!([{"type": 1}])),
                "tools[0].type",
                "must be a string",
            ),
            (
                with("tools", json!([{"name": 1, "input_schema": {}}])),
                "tools[0].name",
                "must be a string",
            ),
            (
                with(
                    "tools",
                    json!([{"name": "n", "description": 1, "input_schema": {}}]),
                ),
                "tools[0].description",
                "must be a string",
            ),
            (
                with("tools", json!([{"name": "n", "input_schema": "object"}])),
                "tools[0].input_schema",
                "must be an object",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": 0}]),
                ),
                "tools[0].max_uses",
                "at least 1, not 0",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": "5"}]),
                ),
                "tools[0].max_uses",
                "must be an integer",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": -1}]),
                ),
                "tools[0].max_uses",
                "at least 1",
            ),
            (
                with("tool_choice", json!("auto")),
                "tool_choice",
                "must be an object",
            ),
            (
                with("tool_choice", json!({"type": 1})),
                "tool_choice.type",
                "must be a string",
            ),
            (
                with("tool_choice", json!({"type": "tool", "name": 1})),
                "tool_choice.name",
                "must be a string",
            ),
            (
                with(
                    "tool_choice",
                    json!({"type": "any", "disable_parallel_tool_use": "yes"}),
                ),
                "tool_choice.disable_parallel_tool_use",
                "must be a boolean",
            ),
            (
                with("thinking", json!(true)),
                "thinking",
                "must be an object",
            ),
            (
                with(
                    "thinking",
                    json!({"type": "enabled", "budget_tokens": 1023}),
                ),
                "thinking.budget_tokens",
                "at least 1024, not 1023",
            ),
            (
                with(
                    "thinking",
                    json!({"type": "enabled", "budget_tokens": "2k"}),
                ),
                "thinking.budget_tokens",
                "must be an integer",
            ),
            (
                with("service_tier", json!(1)),
                "service_tier",
                "must be a string",
            ),
        ];
        for (body, param, words) in cases {
            let (status, found, message) = refusal(&body);
            // A required field sent as null is missing: 400, as chat says.
            let expected_status = if words == "is required" { 400 } else { 422 };
            assert_eq!(
                (status, found.as_str()),
                (expected_status, param),
                "{body}: {message}"
            );
            assert!(message.contains(words), "{body}: {message}");
            assert!(message.contains(&format!("`{param}`")), "{message}");
        }
        // The budget must leave room for the answer inside max_tokens.
        let mut body = with(
            "thinking",
            json!({"type": "enabled", "budget_tokens": 2048}),
        );
        body["max_tokens"] = json!(2048);
        let (status, param, message) = refusal(&body);
        assert_eq!((status, param.as_str()), (422, "thinking.budget_tokens"));
        assert!(
            message.contains("less than `max_tokens` (2048)"),
            "{message}"
        );
        body["max_tokens"] = json!(2049);
        assert_eq!(parse(&body).unwrap().thinking_budget_tokens(), Some(2048));
    }

    #[test]
    fn edges_and_nulls_are_accepted() {
        for (field, value) in [
            ("temperature", json!(0)),
            ("temperature", json!(1)),
            ("top_p", json!(0.0)),
            ("top_k", json!(0)),
            ("max_tokens", json!(1)),
            ("stop_sequences", json!([])),
            ("metadata", json!({})),
            ("metadata", json!({"user_id": null, "other": 1})),
            ("tools", json!([])),
            ("system", json!("")),
            ("system", json!([])),
            ("thinking", json!({"type": "disabled"})),
            ("thinking", json!({"type": "adaptive"})),
            (
                "thinking",
                json!({"type": "enabled", "budget_tokens": 1024}),
            ),
            ("tool_choice", json!({"type": "none"})),
            (
                "tool_choice",
                json!({"type": "any", "disable_parallel_tool_use": true}),
            ),
            ("tool_choice", json!({"type": "tool", "name": "Bash"})),
            ("service_tier", json!("standard_only")),
            (
                "tools",
                json!([{"type": "bash_20250124", "name": "bash"}, {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]),
            ),
        ] {
            let request = parse(&with(field, value.clone()));
            assert!(request.is_ok(), "{field} = {value}: {:?}", request.err());
        }
        for field in [
            "system",
            "max_tokens",
            "stream",
            "temperature",
            "top_p",
            "top_k",
            "stop_sequences",
            "metadata",
            "tools",
            "tool_choice",
            "thinking",
            "service_tier",
        ] {
            assert!(parse(&with(field, Value::Null)).is_ok(), "{field}: null");
        }
        // Other tool types are kept and named; a newer cache option too.
        let request = parse(&with(
            "tools",
            json!([{"type": "code_execution_20250825", "name": "code_execution",
            "cache_control": {"type": "ephemeral", "scope": "global"}}]),
        ))
        .unwrap();
        let tool = &request.tools.as_ref().unwrap()[0];
        assert_eq!(
            tool.kind,
            ToolKind::Other {
                tool_type: "code_execution_20250825".into()
            }
        );
        assert_eq!(
            tool.cache_control.as_ref().unwrap().extra["scope"],
            "global"
        );
        assert_eq!(request.web_search_max_uses(), None);
        assert_eq!(request.prompt_size().server_tool_count, 1);
        // Two web search tools: both bounds add up.
        let request = parse(&with(
            "tools",
            json!([
            {"type": "web_search_20250305", "name": "a", "max_uses": 2},
            {"type": "web_search_20250305", "name": "b", "max_uses": 3}]),
        ))
        .unwrap();
        assert_eq!(request.web_search_max_uses(), Some(5));
    }

    #[test]
    fn non_ascii_and_escapes_are_decoded_exactly() {
        let body = r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"text","text":"caf\u00e9 \ud83d\ude00 \"q\" \\ ü"}]}]}"#;
        let request = MessagesRequest::parse(body.as_bytes()).unwrap();
        let MessagesContent::Blocks(blocks) = &request.messages[0].content else {
            panic!("blocks")
        };
        assert_eq!(
            blocks[0].kind,
            BlockKind::Text {
                text: "café 😀 \"q\" \\ ü".into()
            }
        );
        assert_eq!(
            request.prompt_size().measured_bytes,
            "café 😀 \"q\" \\ ü".len() as u64
        );
    }

    fn any_json() -> impl Strategy<Value = Value> {
        crate::json_input::strategies::any_json(
            &["text", "image", "tool_use", "ephemeral", "base64"],
            &["type", "text", "source"],
        )
    }

    /// A JSON pointer, the path errors name, and the check of the type.
    type TypedPlace = (&'static str, &'static str, fn(&Value) -> bool);

    /// Where a typed value stands in the Claude Code body, and whether a
    /// value is of its type: replacing it with a value of another type
    /// must be a 422 naming that path.
    fn typed_places() -> Vec<TypedPlace> {
        vec![
            ("/model", "model", Value::is_string),
            ("/messages", "messages", Value::is_array),
            ("/max_tokens", "max_tokens", Value::is_number),
            ("/stream", "stream", Value::is_boolean),
            ("/temperature", "temperature", Value::is_number),
            ("/metadata", "metadata", Value::is_object),
            ("/metadata/user_id", "metadata.user_id", Value::is_string),
            ("/system", "system", |v| v.is_string() || v.is_array()),
            ("/system/0/text", "system[0].text", Value::is_string),
            (
                "/system/1/cache_control",
                "system[1].cache_control",
                Value::is_object,
            ),
            (
                "/system/1/cache_control/ttl",
                "system[1].cache_control.ttl",
                Value::is_string,
            ),
            ("/tools", "tools", Value::is_array),
            (
                "/tools/0/input_schema",
                "tools[0].input_schema",
                Value::is_object,
            ),
            (
                "/tools/0/description",
                "tools[0].description",
                Value::is_string,
            ),
            ("/tools/2/max_uses", "tools[2].max_uses", Value::is_number),
            ("/tool_choice", "tool_choice", Value::is_object),
            ("/thinking", "thinking", Value::is_object),
            (
                "/thinking/budget_tokens",
                "thinking.budget_tokens",
                Value::is_number,
            ),
            ("/messages/0/content", "messages[0].content", |v| {
                v.is_string() || v.is_array()
            }),
            (
                "/messages/0/content/1/text",
                "messages[0].content[1].text",
                Value::is_string,
            ),
            ("/messages/1/role", "messages[1].role", Value::is_string),
            (
                "/messages/1/content/2/input",
                "messages[1].content[2].input",
                Value::is_object,
            ),
            (
                "/messages/1/content/0/signature",
                "messages[1].content[0].signature",
                Value::is_string,
            ),
            (
                "/messages/2/content/0/content",
                "messages[2].content[0].content",
                |v| v.is_string() || v.is_array(),
            ),
            (
                "/messages/2/content/0/is_error",
                "messages[2].content[0].is_error",
                Value::is_boolean,
            ),
        ]
    }

    proptest! {
        /// Any JSON value of another type in a typed place is a 422 naming
        /// that place; never a 400 or a panic.
        #[test]
        fn any_value_of_the_wrong_type_is_422_naming_its_path(value in any_json(), place in 0usize..25) {
            let (pointer, param, right_type) = typed_places()[place];
            prop_assume!(!right_type(&value) && !value.is_null());
            let mut body = claude_code();
            *body.pointer_mut(pointer).expect("the place exists") = value;
            let error = parse(&body).unwrap_err();
            prop_assert_eq!(error.status().as_u16(), 422, "{}", error.message());
            prop_assert_eq!(&error.metadata()["param"], param);
        }

        /// Any JSON value anywhere in a valid body (in place of a field's
        /// value, or of a block) is accepted or refused with a 400 or 422,
        /// never a panic.
        #[test]
        fn arbitrary_json_anywhere_never_panics(value in any_json(), place in 0usize..64) {
            let mut body = claude_code();
            let mut pointers = Vec::new();
            crate::json_input::strategies::collect_pointers(&body, String::new(), &mut pointers);
            let pointer = &pointers[place % pointers.len()];
            *body.pointer_mut(pointer).expect("the place exists") = value;
            if let Err(error) = parse(&body) {
                prop_assert!(matches!(error.status().as_u16(), 400 | 422));
            }
            let _ = MessagesRequest::parse_count_tokens(body.to_string().as_bytes());
        }

        #[test]
        fn arbitrary_json_bodies_never_panic(value in any_json()) {
            let _ = parse(&value);
            let _ = parse(&json!({"model": "a/b", "messages": [{"role": "user", "content": [value]}]}));
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = MessagesRequest::parse(&body);
        }

        /// A valid generated request parses to what was sent.
        #[test]
        fn valid_requests_parse_to_what_was_sent(
            model in "[a-z0-9-]{1,12}/[a-zA-Z0-9._-]{1,20}(:free)?",
            texts in proptest::collection::vec((any::<String>(), any::<bool>(), proptest::option::of(any::<bool>())), 1..5),
            system in proptest::option::of(any::<String>()),
            max_tokens in proptest::option::of(2048u64..1_000_000),
            budget in proptest::option::of(1024u64..2048),
            temperature in proptest::option::of(0.0f64..=1.0),
            top_k in proptest::option::of(0u64..500),
            stop in proptest::option::of(proptest::collection::vec(any::<String>(), 0..3)),
            max_uses in proptest::option::of(1u64..100),
            stream in any::<bool>(),
        ) {
            // Each turn alternates; a turn is a string or a text block with
            // (or without) a cache breakpoint of either lifetime.
            let messages: Vec<Value> = texts.iter().enumerate().map(|(index, (text, as_block, ttl))| {
                let role = if index % 2 == 0 { "user" } else { "assistant" };
                let content = if *as_block {
                    let mut block = json!({"type": "text", "text": text});
                    if let Some(one_hour) = ttl {
                        block["cache_control"] = json!({"type": "ephemeral", "ttl": if *one_hour { "1h" } else { "5m" }});
                    }
                    json!([block])
                } else {
                    json!(text)
                };
                json!({"role": role, "content": content})
            }).collect();
            let mut body = json!({"model": model, "messages": messages, "stream": stream});
            if let Some(system) = &system { body["system"] = json!(system); }
            if let Some(max_tokens) = max_tokens { body["max_tokens"] = json!(max_tokens); }
            if let Some(budget) = budget { body["thinking"] = json!({"type": "enabled", "budget_tokens": budget}); }
            if let Some(temperature) = temperature { body["temperature"] = json!(temperature); }
            if let Some(top_k) = top_k { body["top_k"] = json!(top_k); }
            if let Some(stop) = &stop { body["stop_sequences"] = json!(stop); }
            if let Some(max_uses) = max_uses {
                body["tools"] = json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": max_uses}]);
            }
            let request = parse(&body).unwrap();
            prop_assert_eq!(&request.model, &model);
            prop_assert_eq!(request.model_id.as_str(), model.as_str());
            prop_assert_eq!(request.stream, stream);
            prop_assert_eq!(request.max_tokens, max_tokens);
            prop_assert_eq!(request.thinking_budget_tokens(), budget);
            prop_assert_eq!(request.temperature, temperature);
            prop_assert_eq!(request.top_k, top_k);
            prop_assert_eq!(&request.stop_sequences, &stop);
            prop_assert_eq!(request.web_search_max_uses(), max_uses);
            prop_assert_eq!(&request.system, &system.clone().map(SystemPrompt::Text));
            let longest = texts.iter()
                .filter(|(_, as_block, _)| *as_block)
                .filter_map(|(_, _, ttl)| ttl.map(|one_hour| if one_hour { CacheTtl::OneHour } else { CacheTtl::FiveMinutes }))
                .max();
            prop_assert_eq!(request.longest_cache_ttl(), longest);
            let read: Vec<(&str, &str)> = request.messages.iter().map(|message| {
                let text = match &message.content {
                    MessagesContent::Text(text) => text.as_str(),
                    MessagesContent::Blocks(blocks) => match &blocks[0].kind {
                        BlockKind::Text { text } => text.as_str(),
                        _ => "not text",
                    },
                };
                (message.role.as_str(), text)
            }).collect();
            let sent: Vec<(&str, &str)> = texts.iter().enumerate()
                .map(|(index, (text, _, _))| (if index % 2 == 0 { "user" } else { "assistant" }, text.as_str()))
                .collect();
            prop_assert_eq!(read, sent);
            let text_bytes: usize = texts.iter().map(|(text, _, _)| text.len()).sum::<usize>()
                + system.as_ref().map_or(0, String::len);
            // A server tool's definition is counted as its JSON too, though
            // it is bounded apart.
            let tool_bytes = max_uses.map_or(0, |_| json_bytes(&json!({"name": "web_search"})));
            let size = request.prompt_size();
            prop_assert_eq!(size.measured_bytes, text_bytes as u64 + tool_bytes);
            prop_assert_eq!(size.server_tool_count, u64::from(max_uses.is_some()));
        }
    }
}
