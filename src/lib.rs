//! # modelgate
//!
//! Tower layers that give any HTTP service the policy of a model gateway:
//! bearer keys, per-key credit limits (402), account-wide rate limits (429),
//! free-model quotas, body limits, webhook secrets and one JSON error
//! format. State shared between gateway instances lives in a
//! [`store`]: in process ([`store::MemoryStore`]) for one instance, Redis
//! ([`store::RedisStore`]) for many.
//!
//! The foundation is here so far:
//!
//! - [`error`]: [`error::GatewayError`] and the one renderer of the
//!   canonical error body.
//! - [`clock`]: the [`clock::Clock`] the layers read time from, and UTC
//!   calendar periods.
//! - [`store`]: counters, the usage ledger and records, on memory and Redis.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod body;
pub mod clock;
pub mod error;
pub mod error_mapper;
pub mod response_body;
pub mod store;
