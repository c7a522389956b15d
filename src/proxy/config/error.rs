//! [`ConfigError`]: where in the document, and what is wrong there.

/// Why a configuration was refused: where in the document, and what is
/// wrong or expected there.
#[derive(Debug, thiserror::Error)]
#[error("config: {0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub(in crate::proxy) fn new(message: impl std::fmt::Display) -> Self {
        ConfigError(message.to_string())
    }

    /// `message` about the value at `path` (`pricing.models["a/b"]`). A
    /// message that starts with its own place (`credit.byok is …`,
    /// `models["a/b"].prompt_per_million must …`) is joined to the path
    /// rather than repeated after it.
    pub(super) fn at(path: &str, message: impl std::fmt::Display) -> Self {
        let message = message.to_string();
        if path.is_empty() || message.starts_with(path) {
            return ConfigError(message);
        }
        let word = message
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(message.len());
        let placed = message.starts_with(|c: char| c.is_ascii_alphabetic())
            && matches!(message[word..].chars().next(), Some('.' | '['));
        if placed {
            ConfigError(format!("{path}.{message}"))
        } else {
            ConfigError(format!("{path}: {message}"))
        }
    }
}

/// `path` as a config writes it: `providers.openai.headers`, and keys that
/// are not plain names quoted, `pricing.models["openai/gpt-4o"]`.
pub(super) fn written_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut written = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => written.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                let plain = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !plain {
                    written.push_str(&format!("[{key:?}]"));
                    continue;
                }
                if !written.is_empty() {
                    written.push('.');
                }
                written.push_str(key);
            }
            Segment::Unknown => written.push_str(".?"),
        }
    }
    written
}
