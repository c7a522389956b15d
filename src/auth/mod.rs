//! Bearer keys: the [`BearerAuth`] layer, the key headers' parsers, the
//! key format and its hash.
//!
//! [`BearerAuth`] reads the key the request presents with
//! [`presented_key`] (its one `Authorization: Bearer` header, or its one
//! `x-api-key` header as Anthropic's clients send it), looks the key up by its [`KeyHash`] in a
//! [`KeyDirectory`](crate::keys::KeyDirectory) and puts the caller's
//! [`Principal`] into the request's context. Each refusal is a 401 with
//! its own message and `metadata.reason`:
//!
//! | reason | when |
//! |---|---|
//! | `missing_authorization` | neither `Authorization` nor `x-api-key` |
//! | `wrong_scheme` | not the `Bearer` scheme (or a bare key) |
//! | `malformed_authorization` | not exactly `Bearer`, one space, a key (or in `x-api-key`, not the key alone): stray spaces, tabs, line breaks, control or non-token characters, repeated header, over 1 KiB |
//! | `conflicting_keys` | `Authorization` and `x-api-key` hold different keys |
//! | `unknown_key` | not a modelgate key, a bad checksum, or no such key |
//! | `deleted_key`, `expired_key`, `disabled_key` | the key's state |
//!
//! Only the header is read: put BearerAuth before
//! [`BodyLimit`](crate::body::BodyLimit), so a request without a good key
//! costs no body buffering and no parse. With
//! [`BearerAuthLayer::failure_limit`], failed authentications count per
//! client address ([`AuthFailures`]): past the limit they are answered 429
//! `rate_limit_error` with `metadata.reason` `auth_failures` and
//! `Retry-After`. Past it, a key is looked up only when this instance's
//! key cache has found it live before, so a key in use is still served
//! while a blocked address's guesses cost no store read.
//!
//! A management key gets 403 on every route but the key management API and
//! the key queries; a store that cannot answer gives 503, since
//! authentication always fails closed. The `Authorization` header is
//! removed from an admitted request, so the gateway key never travels on. Keys deleted
//! or disabled elsewhere stop within the directory's cache time (1 s by
//! default).
//!
//! The pieces it stands on are public too:
//!
//! - [`parse_bearer`] and [`bearer_token`]: exactly `Bearer`, one space and
//!   a key; stray whitespace, line breaks and repeated headers are errors,
//!   each with a message that says what to send.
//! - [`ApiKey`]: `mg-v1-`, 43 random base62 characters (256 bits) and a
//!   6-character checksum, so a secret scanner can recognise a leaked key
//!   with [`looks_like_key`]; [`ApiKey`]'s docs spell out the format.
//! - [`KeyHash`]: the SHA-256 of a key, all the store keeps; the plaintext
//!   is shown once, at creation.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use modelgate::auth::{looks_like_key, parse_bearer, ApiKey, BearerAuthLayer, HeaderError};
//! use modelgate::context::RequestContext;
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store);
//! let (key, _) = directory.create_key(NewKey::named("ci")).await.unwrap();
//! assert!(looks_like_key(key.expose()));
//!
//! let service = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory))
//!     .service(service_fn(|request: Request<Full<Bytes>>| async move {
//!         let principal = RequestContext::of(&request).and_then(|context| context.principal.as_ref()).unwrap();
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(principal.label.clone()))))
//!     }));
//!
//! let request = |authorization: String| {
//!     Request::get("/api/v1/models").header("authorization", authorization).body(Full::new(Bytes::new())).unwrap()
//! };
//! let ok = service.clone().oneshot(request(format!("Bearer {}", key.expose()))).await.unwrap();
//! assert_eq!(ok.status(), 200);
//! let doubled = service.oneshot(request(format!("Bearer  {}", key.expose()))).await.unwrap();
//! assert_eq!(doubled.status(), 401);
//! assert_eq!(doubled.headers()["www-authenticate"], "Bearer realm=\"modelgate\", error=\"invalid_token\"");
//!
//! // The parser alone:
//! let pasted = format!("Bearer {}\n", key.expose());
//! assert_eq!(parse_bearer(pasted.as_bytes()), Err(HeaderError::ControlCharacter));
//! assert!(!looks_like_key("mg-v1-not-a-key"));
//! # }
//! ```

mod checked;
mod failures;
mod header;
mod imported;
mod layer;
mod service;
mod words;

pub use failures::{AuthFailureLimit, AuthFailures};
pub use header::{
    ApiKeyFault, HeaderError, MAX_AUTHORIZATION_BYTES, X_API_KEY, bearer_token, parse_api_key,
    parse_bearer, presented_key,
};
// The key format lives with the key records; BearerAuth reads it.
pub use crate::keys::{ApiKey, KeyFormatError, KeyHash, looks_like_key};
pub use imported::{ImportedKeys, KeyVerifier, Verification, VerifierError};
pub use layer::BearerAuthLayer;
pub use words::DEFAULT_PRODUCT;
// The principal travels in the request's context.
pub use crate::context::Principal;
pub use service::{Authenticated, BearerAuth, ResponseFuture};
pub(crate) use service::{leaked_key, past_expiry};
pub(crate) use words::AuthWords;
