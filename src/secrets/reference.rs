//! A secret's place as a config writes it: a SecretRef `{source,
//! provider, id}`, or an API key's `{"env"}` / `{"file"}` shorthand.

use std::fmt;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{DEFAULT_PROVIDER, MAX_PROVIDER_TEXT_BYTES, SecretRef, SecretSource, SecretSpec};
use crate::json_input::take_short_text;

/// The longest `source`, `provider` or `id` of a SecretRef, in characters.
pub const MAX_SECRET_REF_FIELD_CHARS: usize = 256;

/// Why a SecretRef was refused: the field (`secret.source`, …) and what
/// is wrong with it. Never repeats a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRefError {
    field: String,
    problem: String,
}

impl SecretRefError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        SecretRefError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field refused, as `secret.<name>`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for SecretRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.problem)
    }
}

impl std::error::Error for SecretRefError {}

impl SecretRef {
    /// Reads `{"source": "env"|"file"|"exec", "provider", "id"}`, each a
    /// string of 1 to [`MAX_SECRET_REF_FIELD_CHARS`] characters without
    /// control characters (trimmed); no other field.
    pub fn from_json(value: &Value) -> Result<SecretRef, SecretRefError> {
        let Value::Object(fields) = value else {
            return Err(SecretRefError::new(
                "secret",
                "must be a SecretRef {source, provider, id}",
            ));
        };
        let mut fields = fields.clone();
        let source = match take_string(&mut fields, "source")?.as_deref() {
            Some("env") => SecretSource::Env,
            Some("file") => SecretSource::File,
            Some("exec") => SecretSource::Exec,
            Some(_) => {
                return Err(SecretRefError::new(
                    "secret.source",
                    "must be \"env\", \"file\" or \"exec\"",
                ));
            }
            None => return Err(SecretRefError::new("secret.source", "is required")),
        };
        let provider = take_string(&mut fields, "provider")?
            .ok_or_else(|| SecretRefError::new("secret.provider", "is required"))?;
        let id = take_string(&mut fields, "id")?
            .ok_or_else(|| SecretRefError::new("secret.id", "is required"))?;
        if let Some(unknown) = fields.keys().next() {
            return Err(SecretRefError::new(
                format!("secret.{unknown}"),
                "is not a SecretRef field (source, provider, id)",
            ));
        }
        Ok(SecretRef {
            source,
            provider,
            id,
        })
    }
}

/// A non-empty string, trimmed, of at most [`MAX_SECRET_REF_FIELD_CHARS`]
/// characters.
fn take_string(
    fields: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<String>, SecretRefError> {
    take_short_text(fields, name, MAX_SECRET_REF_FIELD_CHARS)
        .map_err(|problem| SecretRefError::new(format!("secret.{name}"), problem))
}

/// Where an API key or another secret of the gateway's config is read
/// from: `{"env": "VAR"}` (the `default` provider's variable), `{"file":
/// "/path"}` (the whole file, trimmed: [`SecretSpec::File`]), or a
/// SecretRef `{"source", "provider", "id"}` naming a configured provider.
/// Never inline text: a key in the config file would be one more copy to
/// leak.
pub fn secret_ref_from_json(value: &Value) -> Result<SecretSpec, String> {
    let Value::Object(fields) = value else {
        return Err(
            "must be {\"env\": \"VAR\"}, {\"file\": \"/path\"} or a SecretRef {source, provider, id}, \
             not inline text"
                .into(),
        );
    };
    match (fields.len(), fields.get("env"), fields.get("file")) {
        (1, Some(Value::String(variable)), _) if !variable.is_empty() => {
            Ok(SecretSpec::Ref(SecretRef {
                source: SecretSource::Env,
                provider: DEFAULT_PROVIDER.to_owned(),
                id: variable.clone(),
            }))
        }
        (1, _, Some(Value::String(path))) if !path.is_empty() => {
            if path.len() > MAX_PROVIDER_TEXT_BYTES || path.contains('\0') {
                return Err(format!(
                    "`file` must be a path of at most {MAX_PROVIDER_TEXT_BYTES} bytes, without NUL"
                ));
            }
            Ok(SecretSpec::File(PathBuf::from(path)))
        }
        // An object is never inline text: this is a SecretRef or an error.
        _ => SecretRef::from_json(value)
            .map(SecretSpec::Ref)
            .map_err(|error| error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn api_key_sources_are_env_file_or_a_secret_ref_never_inline() {
        let env = secret_ref_from_json(&json!({"env": "OPENAI_API_KEY"})).unwrap();
        assert_eq!(
            env,
            SecretSpec::Ref(SecretRef {
                source: SecretSource::Env,
                provider: "default".into(),
                id: "OPENAI_API_KEY".into()
            })
        );
        let file = secret_ref_from_json(&json!({"file": "/run/keys/openai"})).unwrap();
        assert_eq!(file, SecretSpec::File("/run/keys/openai".into()));
        let exec =
            secret_ref_from_json(&json!({"source": "exec", "provider": "keyring", "id": "openai"}))
                .unwrap();
        assert_eq!(
            exec,
            SecretSpec::Ref(SecretRef {
                source: SecretSource::Exec,
                provider: "keyring".into(),
                id: "openai".into()
            })
        );
        for (value, words) in [
            (json!("sk-inline-key-0123456789"), "not inline text"),
            (json!({"env": ""}), "secret.source"),
            (json!({"env": "A", "file": "/b"}), "secret.source"),
            (
                json!({"source": "vault", "provider": "p", "id": "i"}),
                "secret.source",
            ),
            (json!({"source": "env", "id": "i"}), "secret.provider"),
            (
                json!({"source": "env", "provider": " ", "id": "i"}),
                "`secret.provider` must be 1 to 256 characters",
            ),
            (
                json!({"source": "env", "provider": "p", "id": 5}),
                "`secret.id` must be a string",
            ),
            (
                json!({"source": "env", "provider": "p", "id": "i", "key": "k"}),
                "`secret.key` is not a SecretRef field",
            ),
            (json!(7), "not inline text"),
            (
                json!({"file": format!("/{}", "x".repeat(4096))}),
                "4096 bytes",
            ),
        ] {
            let error = secret_ref_from_json(&value).unwrap_err();
            assert!(error.contains(words), "{value}: {error}");
        }
    }
}
