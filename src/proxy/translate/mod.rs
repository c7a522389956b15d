//! Translation between Anthropic's Messages API and OpenAI's chat
//! completions, and from OpenAI's Responses API to chat completions, for a
//! provider that does not serve the client's API: the client's request in
//! the provider's API, and the provider's answer (a whole JSON body or a
//! stream of server-sent events) back in the client's.
//!
//! - Requests: [`messages_request_to_chat`], [`chat_request_to_messages`].
//!   Each reads the body with the gateway's own parser; what the other API
//!   cannot say (Anthropic's server tools for a chat provider, `n` above 1
//!   for a Messages provider, a tool call whose arguments are not a JSON
//!   object, …) is a 400 naming the field.
//! - Whole answers: [`chat_response_to_messages`],
//!   [`messages_response_to_chat`]; an answer that cannot be read is a 502.
//! - Streams: [`ChatToMessagesEvents`], [`MessagesToChatEvents`], fed the
//!   upstream's bytes however they are chunked.
//! - Responses (Codex CLI) on a chat provider: [`responses_request_to_chat`]
//!   (function tools pass; tools only the Responses API's servers run are
//!   left out, so the model cannot call them), [`chat_response_to_responses`](responses_response::chat_response_to_responses),
//!   [`ChatToResponsesEvents`](responses_stream::ChatToResponsesEvents) (`response.completed` waits for chat's last
//!   usage; a cut or failed stream is `response.failed`).
//! - [`TranslatedBody`]: one of these on a response body, as
//!   [`Translation`] says.
//!
//! Money is charged from the usage, so it crosses exactly or not at all.
//! Chat's `prompt_tokens` includes the tokens read from the cache
//! (`prompt_tokens_details.cached_tokens`) and written to it
//! (`…cache_write_tokens`); Anthropic's `input_tokens` includes neither
//! (`cache_read_input_tokens`, `cache_creation_input_tokens`); the
//! Responses API's `input_tokens` includes them, as chat's does. Reasoning
//! stays inside the completion's tokens (the Responses API's
//! `output_tokens`). A usage that cannot be read (a
//! count missing, negative or fractional, the cache past the prompt) comes
//! out missing, never as a smaller number.

mod body;
#[cfg(fuzzing)]
pub mod fuzzing;
mod request;
mod response;
// Until the Responses route is wired (issue 50): the lead's part.
mod responses_request;
mod responses_response;
mod responses_stream;
mod stream;
mod usage;

pub(crate) use body::{TranslatedBody, Translation};
pub(crate) use request::{chat_request_to_messages, messages_request_to_chat};
pub(crate) use responses_request::responses_request_to_chat;
