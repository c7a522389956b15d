//! Editing what passes through without rebuilding it: a JSON object's
//! top-level members ([`JsonObject`]) and a server-sent event stream cut
//! into lines and events however its chunks fall ([`SseLines`],
//! [`SseEvents`]), each event handed once to the one reader that reads and
//! edits it.
//!
//! The gateway edits bodies it does not own: a client's chat request (the
//! bound on `max_tokens`), an upstream's answer (the `model` it reports,
//! the usage it hides). Each edit keeps every other byte as it was, so a
//! message's or a completion's text is never parsed into values and
//! written out again. Used by `proxy` and `credit`; depends on `body` for
//! its JSON reader only.

mod events;
mod json;
mod model;
mod sse;

pub(crate) use events::{DataLine, Event, EventData, EventEditor, SseEvents, Verdict};
pub(crate) use json::JsonObject;
pub(crate) use model::ServedModel;
pub use sse::MAX_SSE_LINE_BYTES;
#[cfg(feature = "proxy")]
pub(crate) use sse::{SseLines, SsePiece};

/// In a request's extensions: the layer that meters its answer names this
/// model in each streamed chunk's `model` (and says so with
/// [`ModelNamed`] in the response's), so that each chunk is parsed once.
/// The layer that asks names it itself when the answer lacks the mark.
#[derive(Clone, Debug)]
pub(crate) struct NameModelInStream(pub(crate) std::sync::Arc<str>);

/// In a response's extensions: its stream names the model that
/// [`NameModelInStream`] asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ModelNamed;

#[cfg(test)]
pub(crate) use json::PARSES;
