//! Route secrets: inline text or a [`SecretRef`] resolved at start-up from
//! the environment, a file or a command; compared in constant time; never
//! printed.

use std::fmt;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::config::MIN_SECRET_BYTES;

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

/// Where a route's secret comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSpec {
    /// Written in the config (discouraged: prefer a reference).
    Inline(Secret),
    /// Read at start-up.
    Ref(SecretRef),
}

/// Where a referenced secret is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// The environment variable named `id`.
    Env,
    /// The file at `provider`: all of it (trimmed), or, when `id` is a JSON
    /// pointer (`/hooks/deploy`), that string inside a JSON file.
    File,
    /// The command at `provider` (an absolute path, run without a shell):
    /// it gets `{"protocolVersion": 1, "provider", "ids": [id]}` on stdin and
    /// answers `{"values": {"<id>": "<secret>"}}` on stdout.
    Exec,
}

/// A reference to a secret: `{source, provider, id}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// Where to read it.
    pub source: SecretSource,
    /// The provider: a file path for `file`, a command for `exec`, a name
    /// for `env`.
    pub provider: String,
    /// The secret's name within the source.
    pub id: String,
}

/// Bounds on reading a referenced secret.
#[derive(Clone, Copy, Debug)]
pub struct ResolveLimits {
    /// The largest file or command output read.
    pub max_bytes: usize,
    /// The longest a command may run.
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

/// Why a secret could not be resolved. The message names the source and
/// the reason, never the secret.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ResolveError(String);

/// The secret `spec` names, read now.
pub fn resolve_secret(spec: &SecretSpec, limits: &ResolveLimits) -> Result<Secret, ResolveError> {
    let reference = match spec {
        SecretSpec::Inline(secret) => return Ok(secret.clone()),
        SecretSpec::Ref(reference) => reference,
    };
    let text = match reference.source {
        SecretSource::Env => match std::env::var(&reference.id) {
            Ok(value) => value,
            Err(std::env::VarError::NotPresent) => {
                return Err(ResolveError(format!(
                    "environment variable {} is not set",
                    reference.id
                )))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(ResolveError(format!(
                    "environment variable {} is not UTF-8",
                    reference.id
                )))
            }
        },
        SecretSource::File => from_file(reference, limits)?,
        SecretSource::Exec => from_command(reference, limits)?,
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(ResolveError(format!(
            "the {:?} secret {} is empty",
            reference.source, reference.id
        )));
    }
    // As for inline secrets: a guessable one would let anyone drive the route.
    if text.len() < MIN_SECRET_BYTES {
        return Err(ResolveError(format!(
            "the {:?} secret {} is shorter than {MIN_SECRET_BYTES} bytes",
            reference.source, reference.id
        )));
    }
    Ok(Secret::new(text.to_owned()))
}

fn from_file(reference: &SecretRef, limits: &ResolveLimits) -> Result<String, ResolveError> {
    let path = Path::new(&reference.provider);
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
    let text = String::from_utf8(bytes)
        .map_err(|_| ResolveError(format!("{} is not UTF-8", path.display())))?;
    if !reference.id.starts_with('/') {
        return Ok(text);
    }
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|_| {
        ResolveError(format!(
            "{} is not JSON, so {} cannot point into it",
            path.display(),
            reference.id
        ))
    })?;
    json.pointer(&reference.id)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ResolveError(format!(
                "{} has no string at {}",
                path.display(),
                reference.id
            ))
        })
}

fn from_command(reference: &SecretRef, limits: &ResolveLimits) -> Result<String, ResolveError> {
    let program = Path::new(&reference.provider);
    if !program.is_absolute() {
        return Err(ResolveError(format!(
            "the exec provider {} must be an absolute path (no shell, no PATH search)",
            reference.provider
        )));
    }
    let mut child = Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| ResolveError(format!("cannot run {}: {error}", program.display())))?;
    let request = serde_json::json!({"protocolVersion": 1, "provider": reference.provider, "ids": [reference.id]});
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input is its own business.
        let _ = stdin.write_all(request.to_string().as_bytes());
    }
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let max_bytes = limits.max_bytes;
    let (sender, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = (&mut stdout)
            .take(max_bytes as u64 + 1)
            .read_to_end(&mut bytes);
        let _ = sender.send(bytes);
    });
    let deadline = Instant::now() + limits.exec_timeout;
    let late = || {
        ResolveError(format!(
            "{} did not finish within {} s",
            program.display(),
            limits.exec_timeout.as_secs_f64()
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
        .and_then(|values| values.get(&reference.id))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ResolveError(format!(
                "{} gave no value for {}",
                program.display(),
                reference.id
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(source: SecretSource, provider: &str, id: &str) -> SecretSpec {
        SecretSpec::Ref(SecretRef {
            source,
            provider: provider.to_owned(),
            id: id.to_owned(),
        })
    }

    fn resolve(spec: &SecretSpec) -> Result<Secret, ResolveError> {
        resolve_secret(
            spec,
            &ResolveLimits {
                max_bytes: 256,
                exec_timeout: Duration::from_millis(500),
            },
        )
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
        std::env::set_var("MODELGATE_TEST_HOOK_SECRET", " from-env-0123456789 \n");
        std::env::set_var("MODELGATE_TEST_HOOK_EMPTY", "  ");
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
        std::env::set_var("MODELGATE_TEST_HOOK_SHORT", "guessable");
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
    }

    #[test]
    fn file_secrets_are_whole_files_or_json_pointers_within_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "file-secret-0123456789\n").unwrap();
        let json = dir.path().join("hooks.json");
        std::fs::write(&json, r#"{"hooks": {"deploy": "json-secret-0123456789"}}"#).unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, "x".repeat(300)).unwrap();
        let path = |file: &std::path::Path| file.to_str().unwrap().to_owned();
        assert!(
            resolve(&reference(SecretSource::File, &path(&plain), "value"))
                .unwrap()
                .matches(b"file-secret-0123456789")
        );
        assert!(resolve(&reference(
            SecretSource::File,
            &path(&json),
            "/hooks/deploy"
        ))
        .unwrap()
        .matches(b"json-secret-0123456789"));
        for (file, id, words) in [
            (path(&json), "/hooks/missing", "no string at"),
            (path(&plain), "/x", "not JSON"),
            (path(&big), "value", "larger than"),
            (
                dir.path().join("none").to_str().unwrap().to_owned(),
                "value",
                "cannot open",
            ),
        ] {
            let error = resolve(&reference(SecretSource::File, &file, id))
                .unwrap_err()
                .to_string();
            assert!(error.contains(words), "{error}");
            assert!(!error.contains("0123456789"), "{error}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn exec_secrets_come_from_an_absolute_command_within_its_time() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let good = script(
            "good",
            r#"read request; case "$request" in *'"ids":["deploy"]'*) echo '{"values": {"deploy": "exec-secret-0123456789"}}';; *) exit 3;; esac"#,
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
        assert!(resolve(&reference(SecretSource::Exec, &good, "deploy"))
            .unwrap()
            .matches(b"exec-secret-0123456789"));
        for (command, id, words) in [
            (good.clone(), "other", "exited with"),
            (slow, "deploy", "did not finish"),
            (failing, "deploy", "exited with"),
            (garbage, "deploy", "did not answer JSON"),
            (lingering, "deploy", "did not finish"),
            (verbose, "deploy", "wrote more than 256 bytes"),
            ("relative/cmd".to_owned(), "deploy", "absolute path"),
        ] {
            let error = resolve(&reference(SecretSource::Exec, &command, id))
                .unwrap_err()
                .to_string();
            assert!(error.contains(words), "{command}: {error}");
        }
    }
}
