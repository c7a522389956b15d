//! Bearer keys: the `Authorization` parser, the key format and its hash.
//!
//! `BearerAuth` (still to come) will read the request's one `Authorization`
//! header with [`bearer_token`], look the key up by its [`KeyHash`] and put
//! the caller's `Principal` into the request's extensions, answering 401
//! with the [`HeaderError`] message when the header is malformed. For now
//! this module holds the pieces it stands on:
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
//! use modelgate::auth::{looks_like_key, parse_bearer, ApiKey, HeaderError};
//!
//! let key = ApiKey::generate();
//! assert!(looks_like_key(key.expose()));
//!
//! let header = format!("Bearer {}", key.expose());
//! let token = parse_bearer(header.as_bytes()).unwrap();
//! assert!(ApiKey::parse(token).unwrap().hash() == key.hash());
//!
//! let pasted = format!("Bearer {}\n", key.expose());
//! assert_eq!(parse_bearer(pasted.as_bytes()), Err(HeaderError::ControlCharacter));
//! assert!(!looks_like_key("mg-v1-not-a-key"));
//! ```

mod header;
mod key;

pub use header::{bearer_token, parse_bearer, HeaderError, MAX_AUTHORIZATION_BYTES};
pub use key::{looks_like_key, ApiKey, KeyFormatError, KeyHash};
