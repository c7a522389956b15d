//! The integration tests, one binary: real HTTP on loopback, a real
//! `redis-server` (and a 3-node Cluster), real clients against the real
//! proxy. Each module is an area; `common` holds what they share.

mod common;
#[path = "../../examples/support/mock.rs"]
mod mock;

#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod admission;
#[cfg(feature = "proxy")]
mod alerts;
mod architecture;
mod body_and_error_mapper;
#[cfg(feature = "redis")]
mod byok;
#[cfg(feature = "proxy")]
mod charges_shown;
#[cfg(feature = "proxy")]
mod clients;
#[cfg(feature = "redis")]
mod credit;
#[cfg(feature = "redis")]
mod credit_group_commit;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod docs;
#[cfg(all(feature = "sqlite", feature = "axum"))]
mod embed;
#[cfg(feature = "redis")]
mod keys_and_auth;
#[cfg(all(feature = "redis", feature = "sqlite"))]
mod keys_index;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod late_answers;
#[cfg(all(feature = "redis", feature = "notify"))]
mod leaks;
#[cfg(feature = "redis")]
mod limits;
#[cfg(all(feature = "redis", feature = "proxy"))]
mod management_rate;
#[cfg(feature = "proxy")]
mod messages;
#[cfg(feature = "proxy")]
mod model_names;
#[cfg(feature = "notify")]
mod notify;
#[cfg(all(feature = "redis", feature = "oauth"))]
mod oauth;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod operability;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod operator_key;
#[cfg(feature = "otel")]
mod otel;
#[cfg(all(
    feature = "redis",
    feature = "sqlite",
    feature = "proxy",
    feature = "oauth"
))]
mod overload;
#[cfg(all(feature = "redis", feature = "proxy"))]
mod providers;
#[cfg(all(feature = "redis", feature = "sqlite"))]
mod provision;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod proxy;
#[cfg(feature = "redis")]
mod redis_functions;
#[cfg(all(feature = "redis", feature = "sqlite"))]
mod redis_store;
#[cfg(feature = "proxy")]
mod responses;
#[cfg(feature = "redis")]
mod sent_upstream;
#[cfg(feature = "redis")]
mod service_terms;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod settings_page;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod settlements;
#[cfg(all(feature = "redis", feature = "sqlite", feature = "proxy"))]
mod sqlite_store;
#[cfg(all(feature = "redis", feature = "sqlite"))]
mod store_conformance;
#[cfg(feature = "redis")]
mod usage;
#[cfg(all(
    feature = "redis",
    feature = "sqlite",
    feature = "proxy",
    feature = "flows"
))]
mod webhooks;
