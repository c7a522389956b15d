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
//! written out again. Its JSON reader checks a value as strictly as
//! serde_json skips one, without building it. Used by `proxy` and
//! `credit`; depends on no other module.

mod events;
mod json;
mod model;
mod sse;

pub(crate) use events::{DataLine, Event, EventData, EventEditor, SseEvents, Verdict};
#[cfg(fuzzing)]
pub use json::fuzzing as json_fuzzing;
pub(crate) use json::{JsonObject, ScanMemo};
pub(crate) use model::{MAX_NAMED_JSON_BYTES, ModelNamed, NameModel, ServedModel};
pub use sse::MAX_SSE_LINE_BYTES;
#[cfg(feature = "proxy")]
pub(crate) use sse::{SseLines, SsePiece};

#[cfg(test)]
pub(crate) use json::PARSES;
