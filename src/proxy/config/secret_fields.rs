//! How a config field names a secret: never inline, always where to read
//! it; checked when the config is read, read when its plan is made.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::ConfigError;
use crate::secrets::{
    ResolveLimits, Secret, SecretProviders, SecretSpec, resolve_secret, secret_ref_from_json,
};

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

/// A reference to a secrets provider names one `providers` declares, of
/// the reference's source; a file or an inline text needs nothing.
pub(super) fn check_reference(
    field: &str,
    spec: &SecretSpec,
    providers: &SecretProviders,
) -> Result<(), ConfigError> {
    match spec {
        SecretSpec::Ref(reference) => reference
            .provider_in(providers)
            .map(drop)
            .map_err(|error| ConfigError::at(field, error)),
        SecretSpec::Inline(_) | SecretSpec::File(_) => Ok(()),
    }
}

/// The secret `spec` names, read now; errors name `field`.
pub(super) fn read_secret(
    field: &str,
    spec: &SecretSpec,
    providers: &SecretProviders,
) -> Result<Secret, ConfigError> {
    resolve_secret(spec, providers, &ResolveLimits::default())
        .map_err(|error| ConfigError::new(format!("{field}: {error}")))
}
