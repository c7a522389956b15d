//! Secrets the gateway reads from outside: webhook route secrets, upstream
//! API keys, the leak webhook's signing secret, the SMTP URL.
//!
//! A secret is inline text or a [`SecretRef`] `{source, provider, id}`
//! that [`resolve_secret`] reads from the named provider of
//! [`SecretProviders`] (the config's `secrets.providers` section): the
//! environment (the built-in `default`, or an allowlist), a file (a JSON
//! pointer into it, or all of it) or a command (absolute path, no shell,
//! bounded time and output, [`ResolveLimits`]). A [`Secret`] compares in
//! constant time and never prints.
//!
//! ```
//! use modelgate::secrets::{resolve_secret, ResolveLimits, Secret, SecretProviders, SecretSpec};
//!
//! let secret = resolve_secret(
//!     &SecretSpec::Inline(Secret::new("an-inline-secret-0123456789".into())),
//!     &SecretProviders::default(),
//!     &ResolveLimits::default(),
//! )
//! .unwrap();
//! assert!(secret.matches(b"an-inline-secret-0123456789"));
//! assert_eq!(format!("{secret:?}"), "Secret(…)");
//! ```
//!
//! The providers' configuration and each source are described in
//! [`SecretProviders`].

mod providers;
mod reference;
mod secret;

pub use providers::{
    DEFAULT_PROVIDER, FileMode, MAX_ALLOWLIST_ENTRIES, MAX_EXEC_ARGS, MAX_EXEC_TIMEOUT_MS,
    MAX_PROVIDER_NAME_CHARS, MAX_PROVIDER_TEXT_BYTES, MAX_PROVIDERS, SecretProvider,
    SecretProviders, SecretProvidersError,
};
pub use reference::{MAX_SECRET_REF_FIELD_CHARS, SecretRefError, secret_ref_from_json};
pub use secret::{
    MIN_SECRET_BYTES, Redacted, ResolveError, ResolveLimits, Secret, SecretRef, SecretSource,
    SecretSpec, resolve_secret,
};
