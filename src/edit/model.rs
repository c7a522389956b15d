//! [`ServedModel`]: the model an answer is to name in its `model` field,
//! and the marks by which the layer that asks for it and the layer that
//! does it agree to parse the answer once.

use super::JsonObject;

/// Largest JSON answer held to name its model; a larger one passes on
/// unchanged.
pub(crate) const MAX_NAMED_JSON_BYTES: usize = 8 * 1024 * 1024;

/// In a request's extensions: the layer that meters its answer names this
/// model in its `model` (each streamed chunk's, or the JSON answer's) and
/// says so with [`ModelNamed`] in the response's, so that the answer is
/// parsed once. The layer that asks names it itself when the answer lacks
/// the mark.
#[derive(Clone, Debug)]
pub(crate) struct NameModel(pub(crate) std::sync::Arc<str>);

/// In a response's extensions: its body names the model that
/// [`NameModel`] asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ModelNamed;

/// The model an answer is to name, quoted once per answer rather than
/// once per event.
#[derive(Debug)]
pub(crate) struct ServedModel {
    name: String,
    // The name as a JSON string: an answer that spells it so names it.
    quoted: String,
}

impl ServedModel {
    pub(crate) fn new(name: impl Into<String>) -> ServedModel {
        let name = name.into();
        // A `String` always serialises.
        let quoted = serde_json::to_string(&name).unwrap_or_default();
        ServedModel { name, quoted }
    }

    /// Sets `object`'s `model` to this one when it names another string;
    /// whether it did. A `model` that is not a string, or that is named
    /// twice (the next reader might take the other), is left alone.
    pub(crate) fn name_in(&self, object: &mut JsonObject<'_>) -> bool {
        let Ok(Some(current)) = object.get("model") else {
            return false;
        };
        if current == self.quoted {
            return false;
        }
        match serde_json::from_str::<std::borrow::Cow<'_, str>>(current) {
            Ok(current) if current != self.name => object.set("model", self.quoted.clone()).is_ok(),
            _ => false,
        }
    }
}
