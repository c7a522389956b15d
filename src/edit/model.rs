//! [`ServedModel`]: the model an answer is to name in its `model` field.

use super::JsonObject;

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
