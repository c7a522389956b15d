//! Editing what passes through without rebuilding it: a JSON object's
//! top-level members ([`JsonObject`]) and a server-sent event stream cut
//! into lines however its chunks fall ([`SseLines`]).
//!
//! The gateway edits bodies it does not own: a client's chat request (the
//! bound on `max_tokens`), an upstream's answer (the `model` it reports,
//! the usage it hides). Each edit keeps every other byte as it was, so a
//! message's or a completion's text is never parsed into values and
//! written out again. Used by `proxy` and `credit`; depends on `body` for
//! its JSON reader only.

mod json;
mod sse;

pub(crate) use json::JsonObject;
pub use sse::MAX_SSE_LINE_BYTES;
pub(crate) use sse::{line_content, SseLines, SsePiece};
