//! How a config field names a secret: never inline, always where to read
//! it.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::secrets::{secret_ref_from_json, SecretSpec};

/// A secret's place: `{"env"}`, `{"file"}` or a SecretRef, never inline.
pub(super) fn secret_spec<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<SecretSpec, D::Error> {
    let value = Value::deserialize(deserializer)?;
    secret_ref_from_json(&value).map_err(serde::de::Error::custom)
}

pub(super) fn optional_secret_spec<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SecretSpec>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None => Ok(None),
        Some(value) => secret_ref_from_json(&value)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}
