//! Named secrets providers: the `secrets.providers` section a
//! [`SecretRef`](super::SecretRef)'s `provider` names.
//!
//! ```json
//! {"providers": {
//!   "vault":   {"source": "file", "path": "/run/secrets.json", "mode": "json"},
//!   "apikey":  {"source": "file", "path": "/run/keys/openai", "mode": "singleValue"},
//!   "ci":      {"source": "env", "allowlist": ["CI_HOOK_SECRET"]},
//!   "keyring": {"source": "exec", "command": "/usr/local/bin/get-secret", "args": ["--json"], "timeoutMs": 2000}
//! }}
//! ```
//!
//! - `env`: the reference's `id` is a variable name; with an `allowlist`,
//!   only the variables on it.
//! - `file` (`path` absolute): in `json` mode, the default since one file
//!   usually holds many secrets, `id` is a JSON pointer such as
//!   `/hooks/ci` to a string; in `singleValue` mode the whole file,
//!   trimmed, is the secret and `id` must be `value`.
//! - `exec` (`command` absolute, run without a shell, `args` as its argv):
//!   the command reads `{"protocolVersion": 1, "provider": "<name>", "ids":
//!   ["<id>"]}` on stdin and answers `{"values": {"<id>": "<secret>"}}` on
//!   stdout within `timeoutMs` (1 to 60 000; default 5 s, from
//!   [`ResolveLimits`](super::ResolveLimits)).
//!
//! A provider named `default`, of source `env` with no allowlist, always
//! exists unless the section defines `default` itself: references written
//! `{"source": "env", "provider": "default", "id": "VAR"}` and the
//! `{"env": "VAR"}` key shorthand read the environment with no section at
//! all. A reference to a provider that is not configured, or whose
//! `source` is not that provider's, does not resolve: its webhook route is
//! skipped with a warning, an API key naming it stops the gateway at
//! start-up.
//!
//! ```
//! use modelgate::secrets::{resolve_secret, ResolveLimits, SecretProviders, SecretRef, SecretSource, SecretSpec};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("secrets.json");
//! std::fs::write(&path, r#"{"hooks": {"ci": "ci-hook-secret-0123456789"}}"#).unwrap();
//! let providers = SecretProviders::from_json(&serde_json::json!({"providers": {
//!     "vault": {"source": "file", "path": path, "mode": "json"}
//! }}))
//! .unwrap();
//!
//! let reference = |provider: &str, id: &str| SecretSpec::Ref(SecretRef {
//!     source: SecretSource::File,
//!     provider: provider.into(),
//!     id: id.into(),
//! });
//! let secret = resolve_secret(&reference("vault", "/hooks/ci"), &providers, &ResolveLimits::default()).unwrap();
//! assert!(secret.matches(b"ci-hook-secret-0123456789"));
//!
//! // Not configured: the message names the provider and where to declare it.
//! let error = resolve_secret(&reference("elsewhere", "/hooks/ci"), &providers, &ResolveLimits::default()).unwrap_err();
//! assert!(error.to_string().contains("\"elsewhere\"") && error.to_string().contains("secrets.providers"));
//!
//! // Bad configuration is refused, naming the field.
//! let refused = SecretProviders::from_json(&serde_json::json!({"providers": {
//!     "vault": {"source": "file", "path": "secrets.json"}
//! }}))
//! .unwrap_err();
//! assert_eq!(refused.field(), "secrets.providers.vault.path");
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use super::secret::SecretSource;

/// The name of the built-in environment provider.
pub const DEFAULT_PROVIDER: &str = "default";
/// Most providers one section may declare.
pub const MAX_PROVIDERS: usize = 64;
/// Longest provider name; names are `A-Z a-z 0-9 _ -`.
pub const MAX_PROVIDER_NAME_CHARS: usize = 64;
/// Most variables one `env` provider's allowlist may hold.
pub const MAX_ALLOWLIST_ENTRIES: usize = 1024;
/// Most arguments one `exec` provider may pass.
pub const MAX_EXEC_ARGS: usize = 64;
/// Longest path, command argument or variable name, in bytes.
pub const MAX_PROVIDER_TEXT_BYTES: usize = 4096;
/// Longest `timeoutMs` an `exec` provider may set: start-up waits for it.
pub const MAX_EXEC_TIMEOUT_MS: u64 = 60_000;

/// How a `file` provider reads its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileMode {
    /// A JSON document; a reference's `id` is a JSON pointer (`/hooks/ci`)
    /// to a string in it. The default.
    Json,
    /// The whole file, trimmed, is one secret; a reference's `id` is
    /// `value`.
    SingleValue,
}

/// One configured provider.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretProvider {
    /// Environment variables.
    Env {
        /// The only variables it reads; `None`: any.
        allowlist: Option<BTreeSet<String>>,
    },
    /// A file.
    File {
        /// Its absolute path.
        path: PathBuf,
        /// How it is read.
        mode: FileMode,
    },
    /// A command speaking the exec protocol on stdin and stdout.
    Exec {
        /// Its absolute path; run without a shell.
        command: PathBuf,
        /// Its arguments, as argv.
        args: Vec<String>,
        /// The longest it may run; `None`: [`ResolveLimits::exec_timeout`](super::ResolveLimits::exec_timeout).
        timeout: Option<Duration>,
    },
}

impl SecretProvider {
    /// The source a reference to this provider must name.
    pub fn source(&self) -> SecretSource {
        match self {
            SecretProvider::Env { .. } => SecretSource::Env,
            SecretProvider::File { .. } => SecretSource::File,
            SecretProvider::Exec { .. } => SecretSource::Exec,
        }
    }
}

impl fmt::Debug for SecretProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretProvider::Env { allowlist } => {
                f.debug_struct("Env").field("allowlist", allowlist).finish()
            }
            SecretProvider::File { path, mode } => f
                .debug_struct("File")
                .field("path", path)
                .field("mode", mode)
                .finish(),
            // Arguments may carry a token: counted, never shown.
            SecretProvider::Exec {
                command,
                args,
                timeout,
            } => f
                .debug_struct("Exec")
                .field("command", command)
                .field("args", &format_args!("[…; {}]", args.len()))
                .field("timeout", timeout)
                .finish(),
        }
    }
}

/// The configured providers by name, the built-in `default` included:
/// the config's `secrets` section, `{"providers": {"<name>": {…}}}`, read
/// by [`from_json`](Self::from_json) or serde.
///
/// Each provider is `{"source": "env", "allowlist": ["VAR", …]}`,
/// `{"source": "file", "path": "/abs", "mode": "json" | "singleValue"}`
/// (`json` by default: a reference's `id` is a JSON pointer; in
/// `singleValue` it is `value`) or `{"source": "exec", "command": "/abs",
/// "args": […], "timeoutMs": 1..=60000}`. Names are 1 to 64 characters of
/// `A-Z a-z 0-9 _ -`; unknown fields, relative paths and sizes past the
/// `MAX_*` bounds are refused, naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretProviders {
    by_name: BTreeMap<String, SecretProvider>,
}

impl Default for SecretProviders {
    /// Only the built-in `default`: the environment, any variable.
    fn default() -> Self {
        let mut by_name = BTreeMap::new();
        by_name.insert(
            DEFAULT_PROVIDER.to_owned(),
            SecretProvider::Env { allowlist: None },
        );
        SecretProviders { by_name }
    }
}

/// A `secrets` section refused, naming the field (such as
/// `secrets.providers.vault.path`) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretProvidersError {
    field: String,
    problem: String,
}

impl SecretProvidersError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        SecretProvidersError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field the error is about, from `secrets` down.
    pub fn field(&self) -> &str {
        &self.field
    }
}

impl fmt::Display for SecretProvidersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.problem)
    }
}

impl std::error::Error for SecretProvidersError {}

impl SecretProviders {
    /// Reads the `secrets` section, `{"providers": {"<name>": {…}}}`;
    /// `null` or no `providers` is the built-in `default` alone.
    pub fn from_json(section: &Value) -> Result<Self, SecretProvidersError> {
        let mut providers = SecretProviders::default();
        if section.is_null() {
            return Ok(providers);
        }
        let mut section = object(section, "secrets")?;
        let declared = section.remove("providers");
        if let Some(unknown) = section.keys().next() {
            return Err(SecretProvidersError::new(
                format!("secrets.{unknown}"),
                "is not a field of `secrets` (providers)",
            ));
        }
        let declared = match declared {
            None | Some(Value::Null) => return Ok(providers),
            Some(declared) => object(&declared, "secrets.providers")?,
        };
        if declared.len() > MAX_PROVIDERS {
            return Err(SecretProvidersError::new(
                "secrets.providers",
                format!(
                    "declares {} providers; at most {MAX_PROVIDERS}",
                    declared.len()
                ),
            ));
        }
        // In name order, so the first error reported does not depend on
        // how the map keeps its keys.
        let ordered: BTreeMap<&String, &Value> = declared.iter().collect();
        for (name, provider) in ordered {
            if !is_provider_name(name) {
                return Err(SecretProvidersError::new(
                    "secrets.providers",
                    format!(
                        "has a provider named {name:?}; a name is 1 to {MAX_PROVIDER_NAME_CHARS} \
                         characters of A-Z a-z 0-9 _ -"
                    ),
                ));
            }
            let parsed = parse_provider(&format!("secrets.providers.{name}"), provider)?;
            providers.by_name.insert(name.clone(), parsed);
        }
        Ok(providers)
    }

    /// The provider called `name`.
    pub fn get(&self, name: &str) -> Option<&SecretProvider> {
        self.by_name.get(name)
    }

    /// Every provider with its name, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &SecretProvider)> {
        self.by_name
            .iter()
            .map(|(name, provider)| (name.as_str(), provider))
    }
}

impl<'de> serde::Deserialize<'de> for SecretProviders {
    /// As [`SecretProviders::from_json`] reads it, so a gateway config
    /// refuses a bad `secrets` section when it is read.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        SecretProviders::from_json(&value).map_err(serde::de::Error::custom)
    }
}

fn is_provider_name(name: &str) -> bool {
    (1..=MAX_PROVIDER_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'))
}

fn parse_provider(field: &str, value: &Value) -> Result<SecretProvider, SecretProvidersError> {
    let mut fields = object(value, field)?;
    let source = match fields.remove("source") {
        Some(Value::String(source)) => source,
        None | Some(Value::Null) => {
            return Err(SecretProvidersError::new(
                format!("{field}.source"),
                "is required: \"env\", \"file\" or \"exec\"",
            ));
        }
        Some(_) => {
            return Err(SecretProvidersError::new(
                format!("{field}.source"),
                "must be \"env\", \"file\" or \"exec\"",
            ));
        }
    };
    let provider = match source.as_str() {
        "env" => SecretProvider::Env {
            allowlist: allowlist(field, fields.remove("allowlist"))?,
        },
        "file" => {
            let path = absolute_path(field, "path", fields.remove("path"))?;
            let mode = match fields.remove("mode") {
                None | Some(Value::Null) => FileMode::Json,
                Some(Value::String(mode)) if mode == "json" => FileMode::Json,
                Some(Value::String(mode)) if mode == "singleValue" => FileMode::SingleValue,
                Some(_) => {
                    return Err(SecretProvidersError::new(
                        format!("{field}.mode"),
                        "must be \"json\" (the default) or \"singleValue\"",
                    ));
                }
            };
            SecretProvider::File { path, mode }
        }
        "exec" => SecretProvider::Exec {
            command: absolute_path(field, "command", fields.remove("command"))?,
            args: args(field, fields.remove("args"))?,
            timeout: timeout(field, fields.remove("timeoutMs"))?,
        },
        _ => {
            return Err(SecretProvidersError::new(
                format!("{field}.source"),
                "must be \"env\", \"file\" or \"exec\"",
            ));
        }
    };
    if let Some(unknown) = fields.keys().next() {
        let known = match source.as_str() {
            "env" => "source, allowlist",
            "file" => "source, path, mode",
            _ => "source, command, args, timeoutMs",
        };
        return Err(SecretProvidersError::new(
            format!("{field}.{unknown}"),
            format!("is not a field of {source} providers ({known})"),
        ));
    }
    Ok(provider)
}

fn allowlist(
    field: &str,
    value: Option<Value>,
) -> Result<Option<BTreeSet<String>>, SecretProvidersError> {
    let field = format!("{field}.allowlist");
    let items = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) if items.len() <= MAX_ALLOWLIST_ENTRIES => items,
        Some(_) => {
            return Err(SecretProvidersError::new(
                field,
                format!("must be a list of at most {MAX_ALLOWLIST_ENTRIES} variable names"),
            ));
        }
    };
    let mut names = BTreeSet::new();
    for item in items {
        match item {
            Value::String(name) if is_variable_name(&name) => {
                names.insert(name);
            }
            _ => {
                return Err(SecretProvidersError::new(
                    field,
                    format!(
                        "must hold variable names: 1 to {MAX_PROVIDER_TEXT_BYTES} bytes, \
                         without `=` or NUL"
                    ),
                ));
            }
        }
    }
    Ok(Some(names))
}

/// A name the environment can hold: `=` ends a name and NUL a string.
pub(super) fn is_variable_name(name: &str) -> bool {
    (1..=MAX_PROVIDER_TEXT_BYTES).contains(&name.len()) && !name.contains(['=', '\0'])
}

fn absolute_path(
    field: &str,
    name: &str,
    value: Option<Value>,
) -> Result<PathBuf, SecretProvidersError> {
    let field = format!("{field}.{name}");
    match value {
        None | Some(Value::Null) => Err(SecretProvidersError::new(field, "is required")),
        Some(Value::String(path))
            if path.len() <= MAX_PROVIDER_TEXT_BYTES
                && !path.contains('\0')
                && Path::new(&path).is_absolute() =>
        {
            Ok(PathBuf::from(path))
        }
        Some(_) => Err(SecretProvidersError::new(
            field,
            format!(
                "must be an absolute path (no PATH search, nothing relative to the working \
                 directory) of at most {MAX_PROVIDER_TEXT_BYTES} bytes"
            ),
        )),
    }
}

fn args(field: &str, value: Option<Value>) -> Result<Vec<String>, SecretProvidersError> {
    let field = format!("{field}.args");
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) if items.len() <= MAX_EXEC_ARGS => items,
        Some(_) => {
            return Err(SecretProvidersError::new(
                field,
                format!("must be a list of at most {MAX_EXEC_ARGS} strings"),
            ));
        }
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::String(arg) if arg.len() <= MAX_PROVIDER_TEXT_BYTES && !arg.contains('\0') => {
                Ok(arg)
            }
            _ => Err(SecretProvidersError::new(
                field.clone(),
                format!(
                    "must hold strings of at most {MAX_PROVIDER_TEXT_BYTES} bytes, without NUL"
                ),
            )),
        })
        .collect()
}

fn timeout(field: &str, value: Option<Value>) -> Result<Option<Duration>, SecretProvidersError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => match number.as_u64() {
            Some(ms) if (1..=MAX_EXEC_TIMEOUT_MS).contains(&ms) => {
                Ok(Some(Duration::from_millis(ms)))
            }
            _ => Err(SecretProvidersError::new(
                format!("{field}.timeoutMs"),
                format!("must be a whole number of milliseconds from 1 to {MAX_EXEC_TIMEOUT_MS}"),
            )),
        },
        Some(_) => Err(SecretProvidersError::new(
            format!("{field}.timeoutMs"),
            "must be a number of milliseconds",
        )),
    }
}

fn object(value: &Value, field: &str) -> Result<Map<String, Value>, SecretProvidersError> {
    match value {
        Value::Object(fields) => Ok(fields.clone()),
        _ => Err(SecretProvidersError::new(field, "must be an object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn parsed(providers: Value) -> Result<SecretProviders, SecretProvidersError> {
        SecretProviders::from_json(&json!({ "providers": providers }))
    }

    #[test]
    fn each_kind_is_read_with_its_defaults() {
        let providers = parsed(json!({
            "vault": {"source": "file", "path": "/run/secrets.json"},
            "key": {"source": "file", "path": "/run/keys/openai", "mode": "singleValue"},
            "ci": {"source": "env", "allowlist": ["CI_SECRET", "CI_SECRET"]},
            "keyring": {"source": "exec", "command": "/usr/bin/get", "args": ["--json", ""], "timeoutMs": 250},
            "plain": {"source": "exec", "command": "/usr/bin/get", "args": null, "timeoutMs": null},
        }))
        .unwrap();
        assert_eq!(
            providers.get("vault"),
            Some(&SecretProvider::File {
                path: "/run/secrets.json".into(),
                mode: FileMode::Json
            })
        );
        assert_eq!(
            providers.get("key"),
            Some(&SecretProvider::File {
                path: "/run/keys/openai".into(),
                mode: FileMode::SingleValue
            })
        );
        assert_eq!(
            providers.get("ci"),
            Some(&SecretProvider::Env {
                allowlist: Some(BTreeSet::from(["CI_SECRET".to_owned()]))
            })
        );
        assert_eq!(
            providers.get("keyring"),
            Some(&SecretProvider::Exec {
                command: "/usr/bin/get".into(),
                args: vec!["--json".into(), String::new()],
                timeout: Some(Duration::from_millis(250)),
            })
        );
        assert_eq!(
            providers.get("plain"),
            Some(&SecretProvider::Exec {
                command: "/usr/bin/get".into(),
                args: Vec::new(),
                timeout: None,
            })
        );
        // The built-in one is still there, first in name order.
        assert_eq!(
            providers.get(DEFAULT_PROVIDER),
            Some(&SecretProvider::Env { allowlist: None })
        );
        let names: Vec<&str> = providers.iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["ci", "default", "key", "keyring", "plain", "vault"]);
        // Arguments are counted, never shown.
        assert!(format!("{providers:?}").contains("[…; 2]"));
        assert!(!format!("{providers:?}").contains("--json"));
    }

    #[test]
    fn the_default_provider_is_built_in_unless_the_section_defines_it() {
        for section in [json!(null), json!({}), json!({"providers": null})] {
            assert_eq!(
                SecretProviders::from_json(&section).unwrap(),
                SecretProviders::default()
            );
        }
        let redefined =
            parsed(json!({"default": {"source": "env", "allowlist": ["ONLY_THIS"]}})).unwrap();
        assert_eq!(
            redefined.get(DEFAULT_PROVIDER),
            Some(&SecretProvider::Env {
                allowlist: Some(BTreeSet::from(["ONLY_THIS".to_owned()]))
            })
        );
        let as_file =
            parsed(json!({"default": {"source": "file", "path": "/run/s.json"}})).unwrap();
        assert_eq!(
            as_file.get(DEFAULT_PROVIDER).map(SecretProvider::source),
            Some(SecretSource::File)
        );
    }

    #[test]
    fn each_error_names_its_field() {
        let long = "x".repeat(MAX_PROVIDER_TEXT_BYTES + 1);
        let many: Map<String, Value> = (0..=MAX_PROVIDERS)
            .map(|index| (format!("p{index}"), json!({"source": "env"})))
            .collect();
        for (section, field, words) in [
            (json!([]), "secrets", "must be an object"),
            (json!({"provider": {}}), "secrets.provider", "providers"),
            (json!({"providers": []}), "secrets.providers", "object"),
            (
                json!({"providers": many}),
                "secrets.providers",
                "at most 64",
            ),
            (
                json!({"providers": {"bad name": {"source": "env"}}}),
                "secrets.providers",
                "\"bad name\"",
            ),
            (
                json!({"providers": {"": {"source": "env"}}}),
                "secrets.providers",
                "1 to 64",
            ),
            (
                json!({"providers": {"v": "env"}}),
                "secrets.providers.v",
                "object",
            ),
            (
                json!({"providers": {"v": {}}}),
                "secrets.providers.v.source",
                "is required",
            ),
            (
                json!({"providers": {"v": {"source": "vault"}}}),
                "secrets.providers.v.source",
                "\"exec\"",
            ),
            (
                json!({"providers": {"v": {"source": 1}}}),
                "secrets.providers.v.source",
                "\"env\"",
            ),
            (
                json!({"providers": {"v": {"source": "env", "allowlist": "A"}}}),
                "secrets.providers.v.allowlist",
                "list",
            ),
            (
                json!({"providers": {"v": {"source": "env", "allowlist": ["A=B"]}}}),
                "secrets.providers.v.allowlist",
                "`=`",
            ),
            (
                json!({"providers": {"v": {"source": "env", "allowlist": [""]}}}),
                "secrets.providers.v.allowlist",
                "variable names",
            ),
            (
                json!({"providers": {"v": {"source": "env", "allowlist": [3]}}}),
                "secrets.providers.v.allowlist",
                "variable names",
            ),
            (
                json!({"providers": {"v": {"source": "env", "path": "/x"}}}),
                "secrets.providers.v.path",
                "(source, allowlist)",
            ),
            (
                json!({"providers": {"v": {"source": "file"}}}),
                "secrets.providers.v.path",
                "is required",
            ),
            (
                json!({"providers": {"v": {"source": "file", "path": "run/s.json"}}}),
                "secrets.providers.v.path",
                "absolute path",
            ),
            (
                json!({"providers": {"v": {"source": "file", "path": format!("/{long}")}}}),
                "secrets.providers.v.path",
                "4096 bytes",
            ),
            (
                json!({"providers": {"v": {"source": "file", "path": "/a\u{0}b"}}}),
                "secrets.providers.v.path",
                "absolute path",
            ),
            (
                json!({"providers": {"v": {"source": "file", "path": "/s", "mode": "yaml"}}}),
                "secrets.providers.v.mode",
                "\"singleValue\"",
            ),
            (
                json!({"providers": {"v": {"source": "file", "path": "/s", "command": "/x"}}}),
                "secrets.providers.v.command",
                "(source, path, mode)",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "vault"}}}),
                "secrets.providers.v.command",
                "absolute path",
            ),
            (
                json!({"providers": {"v": {"source": "exec"}}}),
                "secrets.providers.v.command",
                "is required",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "args": "-a"}}}),
                "secrets.providers.v.args",
                "list",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "args": vec!["a"; MAX_EXEC_ARGS + 1]}}}),
                "secrets.providers.v.args",
                "at most 64",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "args": [long]}}}),
                "secrets.providers.v.args",
                "4096 bytes",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "timeoutMs": 0}}}),
                "secrets.providers.v.timeoutMs",
                "from 1 to 60000",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "timeoutMs": 60_001}}}),
                "secrets.providers.v.timeoutMs",
                "from 1 to 60000",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "timeoutMs": 1.5}}}),
                "secrets.providers.v.timeoutMs",
                "whole number",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "timeoutMs": "5000"}}}),
                "secrets.providers.v.timeoutMs",
                "number of milliseconds",
            ),
            (
                json!({"providers": {"v": {"source": "exec", "command": "/x", "timeout": 5}}}),
                "secrets.providers.v.timeout",
                "(source, command, args, timeoutMs)",
            ),
        ] {
            let error = SecretProviders::from_json(&section).unwrap_err();
            assert_eq!(error.field(), field, "{section}: {error}");
            assert!(error.to_string().contains(words), "{section}: {error}");
        }
    }

    #[test]
    fn a_gateway_config_reads_the_section_with_serde() {
        #[derive(serde::Deserialize)]
        struct Config {
            #[serde(default)]
            secrets: SecretProviders,
        }
        let config: Config = serde_json::from_str(
            r#"{"secrets": {"providers": {"v": {"source": "file", "path": "/s.json"}}}}"#,
        )
        .unwrap();
        assert!(config.secrets.get("v").is_some());
        let absent: Config = serde_json::from_str("{}").unwrap();
        assert_eq!(absent.secrets, SecretProviders::default());
        let error = serde_json::from_str::<Config>(
            r#"{"secrets": {"providers": {"v": {"source": "file", "path": "s.json"}}}}"#,
        )
        .err()
        .unwrap();
        assert!(
            error.to_string().contains("secrets.providers.v.path"),
            "{error}"
        );
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            prop_oneof![
                Just("env".to_owned()),
                Just("file".to_owned()),
                Just("exec".to_owned()),
                Just("json".to_owned()),
                Just("singleValue".to_owned()),
                "/[a-z/]{0,12}",
                "[a-zA-Z/=._ -]{0,12}",
            ]
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("providers".to_owned()),
                        Just("source".to_owned()),
                        Just("path".to_owned()),
                        Just("mode".to_owned()),
                        Just("allowlist".to_owned()),
                        Just("command".to_owned()),
                        Just("args".to_owned()),
                        Just("timeoutMs".to_owned()),
                        Just("default".to_owned()),
                        "[a-z ]{1,6}"
                    ],
                    inner,
                    0..5
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// A provider of each kind with every field right, as JSON.
    fn valid_provider() -> impl Strategy<Value = Value> {
        prop_oneof![
            proptest::option::of(proptest::collection::vec("[A-Z_]{1,8}", 0..3)).prop_map(
                |allowlist| match allowlist {
                    Some(names) => json!({"source": "env", "allowlist": names}),
                    None => json!({"source": "env"}),
                }
            ),
            (
                "/[a-z]{1,8}",
                prop_oneof![Just("json"), Just("singleValue")]
            )
                .prop_map(|(path, mode)| json!({"source": "file", "path": path, "mode": mode})),
            (
                "/[a-z]{1,8}",
                proptest::collection::vec("[a-z-]{0,6}", 0..3),
                1..=MAX_EXEC_TIMEOUT_MS
            )
                .prop_map(|(command, args, ms)| {
                    json!({"source": "exec", "command": command, "args": args, "timeoutMs": ms})
                }),
        ]
    }

    proptest! {
        #[test]
        fn any_json_is_providers_or_an_error_never_a_panic(section in json_value()) {
            match SecretProviders::from_json(&section) {
                Ok(providers) => {
                    prop_assert!(providers.get(DEFAULT_PROVIDER).is_some());
                    for (name, provider) in providers.iter() {
                        prop_assert!(is_provider_name(name));
                        match provider {
                            SecretProvider::Env { .. } => {}
                            SecretProvider::File { path, .. } => prop_assert!(path.is_absolute()),
                            SecretProvider::Exec { command, timeout, .. } => {
                                prop_assert!(command.is_absolute());
                                prop_assert!(timeout.is_none_or(|timeout| timeout.as_millis() <= u128::from(MAX_EXEC_TIMEOUT_MS)));
                            }
                        }
                    }
                }
                Err(error) => prop_assert!(error.field().starts_with("secrets")),
            }
        }

        /// A valid provider with one field added or one field's value
        /// replaced by something of another type is refused, naming that
        /// field.
        #[test]
        fn unknown_or_mistyped_fields_are_refused_by_name(
            provider in valid_provider(),
            unknown in "[a-z]{1,8}",
            mistype in 0usize..8,
            wrong in prop_oneof![Just(json!(true)), Just(json!({})), Just(json!(-1)), Just(json!([[1]]))],
        ) {
            let valid = parsed(json!({"p": provider.clone()}));
            prop_assert!(valid.is_ok(), "{:?}", valid);
            let mut with_unknown = provider.as_object().unwrap().clone();
            if !with_unknown.contains_key(&unknown) {
                with_unknown.insert(unknown.clone(), json!("x"));
                let error = parsed(json!({"p": with_unknown})).unwrap_err();
                prop_assert_eq!(error.field(), format!("secrets.providers.p.{unknown}"));
            }
            let mut mistyped = provider.as_object().unwrap().clone();
            let keys: Vec<String> = mistyped.keys().cloned().collect();
            let key = keys[mistype % keys.len()].clone();
            mistyped.insert(key.clone(), wrong);
            let error = parsed(json!({"p": mistyped})).unwrap_err();
            prop_assert_eq!(error.field(), format!("secrets.providers.p.{key}"));
        }
    }
}
