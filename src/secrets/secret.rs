//! Route secrets: inline text or a [`SecretRef`] to a named provider
//! ([`SecretProviders`]: the environment, a file or a command) resolved at
//! start-up; compared in constant time; never printed.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::providers::{FileMode, SecretProvider, SecretProviders, is_variable_name};

/// The shortest secret accepted, in bytes, inline or read from a provider:
/// a guessable one would let anyone drive a webhook route's flows or sign
/// a leak notice.
pub const MIN_SECRET_BYTES: usize = 16;

/// A shared secret. `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `text`.
    pub fn new(text: String) -> Self {
        Secret(text)
    }

    /// The secret's text, for a caller that must send it on (a provider's
    /// API key); never for a log.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this secret, in constant time: both sides are
    /// hashed first, so neither the content nor the length leaks through
    /// timing.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let expected = Sha256::digest(self.0.as_bytes());
        let given = Sha256::digest(presented);
        expected.ct_eq(&given).into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// A value that may be a credential (a header's value, a URL with a
/// password in it, a command's arguments), deserialized as `T` itself and
/// printed by `Debug` as `[redacted]`: a config type holding one can
/// derive `Debug` and show every field without showing it.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(transparent)]
pub struct Redacted<T>(pub T);

impl<T> Redacted<T> {
    /// The value, for a caller that must use it (send the header, open
    /// the connection); never for a log.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Redacted<T> {
    fn from(value: T) -> Self {
        Redacted(value)
    }
}

impl From<&str> for Redacted<String> {
    fn from(text: &str) -> Self {
        Redacted(text.to_owned())
    }
}

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Where a route's secret comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSpec {
    /// Written in the config (discouraged: prefer a reference).
    Inline(Secret),
    /// Read at start-up from a configured provider.
    Ref(SecretRef),
    /// The whole file at this path, trimmed, read at start-up: what the
    /// `{"file": "/path"}` shorthand of an API key names, as a
    /// `singleValue` file provider would read it.
    File(PathBuf),
}

/// The kind of provider a reference expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// An `env` provider: the environment variable named `id`.
    Env,
    /// A `file` provider: the string at the JSON pointer `id` (`/hooks/ci`)
    /// in its file (`json` mode), or its whole file, `id` being `value`
    /// (`singleValue` mode).
    File,
    /// An `exec` provider: what its command answers for `id` (see
    /// [`SecretProviders`]).
    Exec,
}

impl SecretSource {
    /// The name configs use: `env`, `file` or `exec`.
    pub fn as_str(self) -> &'static str {
        match self {
            SecretSource::Env => "env",
            SecretSource::File => "file",
            SecretSource::Exec => "exec",
        }
    }
}

/// A reference to a secret: `{source, provider, id}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// The kind of provider it expects; must be the named provider's.
    pub source: SecretSource,
    /// The name of a provider in [`SecretProviders`]; `default` is the
    /// built-in environment provider unless the config defines it.
    pub provider: String,
    /// The secret's name within the provider.
    pub id: String,
}

impl SecretRef {
    /// The provider this reference names in `providers`, if it has one
    /// and of the reference's source: what a config can be checked for
    /// before any secret is read.
    pub fn provider_in<'a>(
        &self,
        providers: &'a SecretProviders,
    ) -> Result<&'a SecretProvider, ResolveError> {
        let reference = self;
        let name = &reference.provider;
        let Some(provider) = providers.get(name) else {
            let configured: Vec<&str> = providers.iter().map(|(name, _)| name).collect();
            // Refs once named a file or command in `provider`; say what to do now.
            let hint = if name.contains('/') {
                "; a path is no longer a provider: declare a file or exec provider with that path \
             under secrets.providers and name it here"
            } else {
                ""
            };
            return Err(ResolveError(format!(
                "no secrets provider is named {name:?}: declare it under secrets.providers \
             (configured: {}){hint}",
                configured.join(", ")
            )));
        };
        if provider.source() != reference.source {
            return Err(ResolveError(format!(
                "secrets provider {name:?} has source {:?}, but the reference's source is {:?}",
                provider.source().as_str(),
                reference.source.as_str()
            )));
        }
        Ok(provider)
    }
}

/// Bounds on reading a referenced secret.
#[derive(Clone, Copy, Debug)]
pub struct ResolveLimits {
    /// The largest file or command output read.
    pub max_bytes: usize,
    /// The longest a command may run when its provider sets no
    /// `timeoutMs`.
    pub exec_timeout: Duration,
}

impl Default for ResolveLimits {
    /// 64 KiB, 5 s.
    fn default() -> Self {
        ResolveLimits {
            max_bytes: 64 * 1024,
            exec_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a secret could not be resolved. The message names the provider,
/// the secret's id and the reason, never the secret.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ResolveError(String);

/// The secret `spec` names, read now from its provider in `providers`.
///
/// A reference to a provider `providers` does not have, or whose `source`
/// is not that provider's, is an error naming the provider.
pub fn resolve_secret(
    spec: &SecretSpec,
    providers: &SecretProviders,
    limits: &ResolveLimits,
) -> Result<Secret, ResolveError> {
    let (text, what) = match spec {
        // Checked again here for a spec built in code, not read from a file.
        SecretSpec::Inline(secret) if secret.expose().len() < MIN_SECRET_BYTES => {
            return Err(ResolveError(format!(
                "an inline secret is shorter than {MIN_SECRET_BYTES} bytes"
            )));
        }
        SecretSpec::Inline(secret) => return Ok(secret.clone()),
        SecretSpec::File(path) => (
            read_file(path, limits)?,
            format!("the secret in {}", path.display()),
        ),
        SecretSpec::Ref(reference) => (
            from_provider(reference, providers, limits)?,
            format!(
                "the secret {:?} of provider {:?}",
                reference.id, reference.provider
            ),
        ),
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(ResolveError(format!("{what} is empty")));
    }
    // As for inline secrets: a guessable one would let anyone drive the route.
    if text.len() < MIN_SECRET_BYTES {
        return Err(ResolveError(format!(
            "{what} is shorter than {MIN_SECRET_BYTES} bytes"
        )));
    }
    Ok(Secret::new(text.to_owned()))
}

fn from_provider(
    reference: &SecretRef,
    providers: &SecretProviders,
    limits: &ResolveLimits,
) -> Result<String, ResolveError> {
    let provider = reference.provider_in(providers)?;
    let name = &reference.provider;
    let id = &reference.id;
    match provider {
        SecretProvider::Env { allowlist } => from_env(name, allowlist.as_ref(), id),
        SecretProvider::File { path, mode } => {
            match mode {
                FileMode::SingleValue if id != "value" => {
                    return Err(ResolveError(format!(
                        "secrets provider {name:?} reads its whole file (singleValue mode): \
                         the reference's id must be \"value\", not {id:?}"
                    )));
                }
                FileMode::Json if !id.starts_with('/') => {
                    return Err(ResolveError(format!(
                        "secrets provider {name:?} reads a JSON file (json mode): the \
                         reference's id must be a JSON pointer such as /hooks/ci, not {id:?}"
                    )));
                }
                _ => {}
            }
            let text = read_file(path, limits)?;
            match mode {
                FileMode::SingleValue => Ok(text),
                FileMode::Json => at_pointer(path, &text, id),
            }
        }
        SecretProvider::Exec {
            command,
            args,
            timeout,
        } => from_command(
            name,
            command,
            args,
            id,
            timeout.unwrap_or(limits.exec_timeout),
            limits.max_bytes,
        ),
    }
}

fn from_env(
    provider: &str,
    allowlist: Option<&BTreeSet<String>>,
    variable: &str,
) -> Result<String, ResolveError> {
    if !is_variable_name(variable) {
        return Err(ResolveError(format!(
            "{variable:?} is not an environment variable name (secrets provider {provider:?})"
        )));
    }
    if allowlist.is_some_and(|allowed| !allowed.contains(variable)) {
        return Err(ResolveError(format!(
            "environment variable {variable} is not on the allowlist of secrets provider \
             {provider:?}"
        )));
    }
    match std::env::var(variable) {
        Ok(value) => Ok(value),
        Err(std::env::VarError::NotPresent) => Err(ResolveError(format!(
            "environment variable {variable} is not set"
        ))),
        Err(std::env::VarError::NotUnicode(_)) => Err(ResolveError(format!(
            "environment variable {variable} is not UTF-8"
        ))),
    }
}

/// The whole file at `path`, at most `limits.max_bytes`, as UTF-8.
fn read_file(path: &Path, limits: &ResolveLimits) -> Result<String, ResolveError> {
    let file = std::fs::File::open(path)
        .map_err(|error| ResolveError(format!("cannot open {}: {error}", path.display())))?;
    let mut bytes = Vec::new();
    file.take(limits.max_bytes as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| ResolveError(format!("cannot read {}: {error}", path.display())))?;
    if bytes.len() > limits.max_bytes {
        return Err(ResolveError(format!(
            "{} is larger than {} bytes",
            path.display(),
            limits.max_bytes
        )));
    }
    String::from_utf8(bytes).map_err(|_| ResolveError(format!("{} is not UTF-8", path.display())))
}

/// The string at `pointer` in the JSON document `text`, read from `path`.
fn at_pointer(path: &Path, text: &str, pointer: &str) -> Result<String, ResolveError> {
    let json: serde_json::Value = serde_json::from_str(text).map_err(|_| {
        ResolveError(format!(
            "{} is not JSON, so {pointer} cannot point into it",
            path.display()
        ))
    })?;
    json.pointer(pointer)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ResolveError(format!("{} has no string at {pointer}", path.display())))
}

fn from_command(
    provider: &str,
    program: &Path,
    args: &[String],
    id: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<String, ResolveError> {
    if !program.is_absolute() {
        return Err(ResolveError(format!(
            "the command of secrets provider {provider:?}, {}, must be an absolute path (no \
             shell, no PATH search)",
            program.display()
        )));
    }
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| ResolveError(format!("cannot run {}: {error}", program.display())))?;
    let request = serde_json::json!({"protocolVersion": 1, "provider": provider, "ids": [id]});
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input is its own business.
        let _ = stdin.write_all(request.to_string().as_bytes());
    }
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let (sender, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = (&mut stdout)
            .take(max_bytes as u64 + 1)
            .read_to_end(&mut bytes);
        let _ = sender.send(bytes);
    });
    let deadline = Instant::now() + timeout;
    let late = || {
        ResolveError(format!(
            "{} did not finish within {} s",
            program.display(),
            timeout.as_secs_f64()
        ))
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(late());
            }
        }
    };
    // The output must end by the same deadline: a child left running in
    // the background may hold the pipe open for ever (its reader thread is
    // then abandoned, not waited for).
    let bytes = output
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .map_err(|_| late())?;
    // Too much output first: the reader stopping early may have killed the
    // command with SIGPIPE, which is not the reason to report.
    if bytes.len() > max_bytes {
        return Err(ResolveError(format!(
            "{} wrote more than {max_bytes} bytes",
            program.display()
        )));
    }
    if !status.success() {
        return Err(ResolveError(format!(
            "{} exited with {status}",
            program.display()
        )));
    }
    let answer: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|_| ResolveError(format!("{} did not answer JSON", program.display())))?;
    answer
        .get("values")
        .and_then(|values| values.get(id))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ResolveError(format!("{} gave no value for {id}", program.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inline_secret_built_in_code_is_as_long_as_a_read_one() {
        let short = SecretSpec::Inline(Secret::new("short".to_owned()));
        let error = resolve_secret(
            &short,
            &SecretProviders::default(),
            &ResolveLimits::default(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(error, "an inline secret is shorter than 16 bytes");
        let long = SecretSpec::Inline(Secret::new("0123456789abcdef".to_owned()));
        assert!(
            resolve_secret(
                &long,
                &SecretProviders::default(),
                &ResolveLimits::default()
            )
            .is_ok()
        );
    }
    use serde_json::json;

    fn reference(source: SecretSource, provider: &str, id: &str) -> SecretSpec {
        SecretSpec::Ref(SecretRef {
            source,
            provider: provider.to_owned(),
            id: id.to_owned(),
        })
    }

    fn limits() -> ResolveLimits {
        ResolveLimits {
            max_bytes: 256,
            exec_timeout: Duration::from_millis(500),
        }
    }

    fn resolve(spec: &SecretSpec) -> Result<Secret, ResolveError> {
        resolve_secret(spec, &SecretProviders::default(), &limits())
    }

    fn providers(section: serde_json::Value) -> SecretProviders {
        SecretProviders::from_json(&json!({ "providers": section })).unwrap()
    }

    #[test]
    fn secrets_match_in_constant_time_and_never_print() {
        let secret = Secret::new("correct horse battery staple".into());
        assert!(secret.matches(b"correct horse battery staple"));
        assert!(!secret.matches(b"correct horse battery stapl"));
        assert!(!secret.matches(b""));
        assert_eq!(format!("{secret:?}"), "Secret(…)");
    }

    #[test]
    fn env_secrets_must_be_set_and_not_empty() {
        // The variables are set for the tests in .cargo/config.toml.
        let secret = resolve(&reference(
            SecretSource::Env,
            "default",
            "MODELGATE_TEST_HOOK_SECRET",
        ))
        .unwrap();
        assert!(secret.matches(b"from-env-0123456789"));
        let missing = resolve(&reference(
            SecretSource::Env,
            "default",
            "MODELGATE_TEST_HOOK_MISSING",
        ))
        .unwrap_err();
        assert!(missing.to_string().contains("is not set"));
        let empty = resolve(&reference(
            SecretSource::Env,
            "default",
            "MODELGATE_TEST_HOOK_EMPTY",
        ))
        .unwrap_err();
        assert!(empty.to_string().contains("empty"));
        let short = resolve(&reference(
            SecretSource::Env,
            "default",
            "MODELGATE_TEST_HOOK_SHORT",
        ))
        .unwrap_err();
        assert!(
            short.to_string().contains("shorter than 16 bytes"),
            "{short}"
        );
        assert!(!short.to_string().contains("guessable"));
        for name in ["A=B", ""] {
            let error = resolve(&reference(SecretSource::Env, "default", name)).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("not an environment variable name"),
                "{error}"
            );
        }
    }

    #[test]
    fn an_env_provider_reads_only_its_allowlist() {
        // Both are set for the tests in .cargo/config.toml.
        let providers = providers(json!({
            "ci": {"source": "env", "allowlist": ["MODELGATE_TEST_ALLOWED_SECRET"]}
        }));
        let read = |id: &str| {
            resolve_secret(
                &reference(SecretSource::Env, "ci", id),
                &providers,
                &limits(),
            )
        };
        assert!(
            read("MODELGATE_TEST_ALLOWED_SECRET")
                .unwrap()
                .matches(b"allowed-secret-0123456789")
        );
        let refused = read("MODELGATE_TEST_FORBIDDEN_SECRET")
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("not on the allowlist") && refused.contains("\"ci\""),
            "{refused}"
        );
        assert!(!refused.contains("forbidden-secret"), "{refused}");
    }

    #[test]
    fn unknown_providers_and_mismatched_sources_are_named_not_read() {
        let providers =
            providers(json!({"vault": {"source": "file", "path": "/nonexistent/s.json"}}));
        for (spec, words) in [
            (
                reference(SecretSource::File, "elsewhere", "/a"),
                vec![
                    "\"elsewhere\"",
                    "secrets.providers",
                    "configured: default, vault",
                ],
            ),
            // The way refs were written before providers had names.
            (
                reference(SecretSource::File, "/run/keys/x", "value"),
                vec!["\"/run/keys/x\"", "a path is no longer a provider"],
            ),
            (
                reference(SecretSource::Env, "vault", "/a"),
                vec!["\"vault\"", "has source \"file\"", "source is \"env\""],
            ),
            (
                reference(SecretSource::Exec, "default", "X"),
                vec!["\"default\"", "has source \"env\""],
            ),
        ] {
            let error = resolve_secret(&spec, &providers, &limits())
                .unwrap_err()
                .to_string();
            for word in words {
                assert!(error.contains(word), "{word:?} missing: {error}");
            }
        }
    }

    #[test]
    fn file_providers_read_a_json_pointer_or_the_whole_file_within_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "file-secret-0123456789\n").unwrap();
        let json = dir.path().join("hooks.json");
        std::fs::write(
            &json,
            r#"{"hooks": {"deploy": "json-secret-0123456789", "n": 7}}"#,
        )
        .unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, "x".repeat(300)).unwrap();
        let providers = providers(json!({
            "whole": {"source": "file", "path": plain, "mode": "singleValue"},
            "vault": {"source": "file", "path": json, "mode": "json"},
            "implicit": {"source": "file", "path": json},
            "text": {"source": "file", "path": plain},
            "big": {"source": "file", "path": big, "mode": "singleValue"},
            "none": {"source": "file", "path": dir.path().join("none"), "mode": "singleValue"},
        }));
        let read = |provider: &str, id: &str| {
            resolve_secret(
                &reference(SecretSource::File, provider, id),
                &providers,
                &limits(),
            )
        };
        assert!(
            read("whole", "value")
                .unwrap()
                .matches(b"file-secret-0123456789")
        );
        assert!(
            read("vault", "/hooks/deploy")
                .unwrap()
                .matches(b"json-secret-0123456789")
        );
        // json is the default mode.
        assert!(
            read("implicit", "/hooks/deploy")
                .unwrap()
                .matches(b"json-secret-0123456789")
        );
        for (provider, id, words) in [
            ("vault", "/hooks/missing", "no string at"),
            ("vault", "/hooks/n", "no string at"),
            (
                "vault",
                "hooks/deploy",
                "must be a JSON pointer such as /hooks/ci",
            ),
            ("whole", "/hooks/deploy", "must be \"value\""),
            ("text", "/x", "not JSON"),
            ("big", "value", "larger than"),
            ("none", "value", "cannot open"),
        ] {
            let error = read(provider, id).unwrap_err().to_string();
            assert!(error.contains(words), "{provider} {id}: {error}");
            assert!(!error.contains("0123456789"), "{error}");
        }
        // The `{"file": "/path"}` shorthand: the whole file.
        assert!(
            resolve(&SecretSpec::File(plain))
                .unwrap()
                .matches(b"file-secret-0123456789")
        );
        let short = dir.path().join("short");
        std::fs::write(&short, "tiny\n").unwrap();
        let error = resolve(&SecretSpec::File(short)).unwrap_err().to_string();
        assert!(error.contains("shorter than 16 bytes"), "{error}");
    }

    #[cfg(unix)]
    #[test]
    fn exec_providers_run_an_absolute_command_with_its_args_within_its_time() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
            path
        };
        // Answers only with its two arguments as given (no shell splitting)
        // and a request naming the provider and the id.
        let good = script(
            "good",
            r#"[ "$#" = 2 ] && [ "$1" = "--field" ] && [ "$2" = "a b" ] || exit 4
read request; case "$request" in *'"provider":"keyring"'*'"ids":["deploy"]'*|*'"ids":["deploy"]'*'"provider":"keyring"'*) echo '{"values": {"deploy": "exec-secret-0123456789"}}';; *) exit 3;; esac"#,
        );
        let slow = script("slow", "sleep 5");
        let failing = script("failing", "exit 7");
        let garbage = script("garbage", "echo not json");
        // Exits at once but leaves a child holding its output open.
        let lingering = script(
            "lingering",
            r#"sleep 5 & echo '{"values": {"deploy": "exec-secret-0123456789"}}'"#,
        );
        let verbose = script("verbose", "head -c 100000 /dev/zero | tr '\\0' x");
        let providers = providers(json!({
            "keyring": {"source": "exec", "command": good, "args": ["--field", "a b"]},
            "noargs": {"source": "exec", "command": good},
            "slow": {"source": "exec", "command": slow},
            "quick": {"source": "exec", "command": slow, "timeoutMs": 50},
            "failing": {"source": "exec", "command": failing},
            "garbage": {"source": "exec", "command": garbage},
            "lingering": {"source": "exec", "command": lingering},
            "verbose": {"source": "exec", "command": verbose},
        }));
        let read = |provider: &str, id: &str| {
            resolve_secret(
                &reference(SecretSource::Exec, provider, id),
                &providers,
                &limits(),
            )
        };
        assert!(
            read("keyring", "deploy")
                .unwrap()
                .matches(b"exec-secret-0123456789")
        );
        for (provider, id, words) in [
            ("keyring", "other", "exited with"),
            ("noargs", "deploy", "exited with"),
            ("slow", "deploy", "did not finish within 0.5 s"),
            ("quick", "deploy", "did not finish within 0.05 s"),
            ("failing", "deploy", "exited with"),
            ("garbage", "deploy", "did not answer JSON"),
            ("lingering", "deploy", "did not finish"),
            ("verbose", "deploy", "wrote more than 256 bytes"),
        ] {
            let error = read(provider, id).unwrap_err().to_string();
            assert!(error.contains(words), "{provider}: {error}");
        }
        // A provider built in code rather than read from a config still
        // never runs a relative command.
        let error = from_command(
            "r",
            Path::new("relative/cmd"),
            &[],
            "deploy",
            Duration::from_millis(50),
            256,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("absolute path"), "{error}");
    }
}
