//! The JSON API: the key management API (keys, accounts, credits, the
//! accounts' own provider keys) and the calling key's own queries, as one
//! route table (`routes.rs`: each entry a path, its methods, who may call
//! it and its handler), answered by [`KeyRoutes`]. The records it serves are
//! [`keys`](crate::keys)'s; the usage records [`usage`](crate::usage)'s;
//! app approvals [`oauth`](crate::oauth)'s.
//!
//! A service that wants these routes under a prefix of its own mounts
//! [`MountedKeyRoutes`] (`Router::nest_service("/billing/v2", …)`): the
//! same table, each path without `/api/v1`, authenticated by itself.
//!
//! Endpoints ([`KeyRoutes`] answers them; everything else passes through):
//!
//! | method and path | who | answer |
//! |---|---|---|
//! | `GET /api/v1/key` | any key | `{"data": {label, limit, limit_reset, limit_remaining, include_byok_in_limit, usage…, byok_usage…, is_free_tier, free_model_daily_requests}}` |
//! | `GET /api/v1/generation?id=`, `GET /api/v1/generations`, `GET /api/v1/apps` | see [`crate::usage`] | a request's record, the account's newest, the app ranking |
//! | `GET /api/v1/activity?date=&account=` | management key (the operator's names the account) | the account's requests, tokens and spend per UTC day and model ([`crate::usage`]) |
//! | `GET /api/v1/credits` | any key | `{"data": {total_credits, total_usage}}` of the key's account |
//! | `GET /user/balance` | any key | `{is_available, balance_infos: [{currency, total_balance, granted_balance, topped_up_balance}]}` |
//! | `POST /api/v1/keys` `{name, account?, management?, limit?, limit_reset?, include_byok_in_limit?, expires_at?, allowed_models?, rate_limit?}` | management key | 201 `{"key": "<plaintext, shown once>", "data": {…}}`; an `account` that does not exist is 422 `unknown_account` (accounts are made by `POST /api/v1/accounts`; `default` always exists) |
//! | `GET /api/v1/keys?offset=&include_disabled=&account=` | management key | `{"data": [{…}, …]}`, 100 a page |
//! | `GET`, `PATCH`, `DELETE /api/v1/keys/{hash}` | management key | `{"data": {…}}`; delete gives `{"deleted": true}`; enabling a leaked key is 422 `leaked_key`; disabling or deleting the calling key itself is 409 `own_key` |
//! | `POST /api/v1/keys/{hash}/rotate` `{grace_seconds?}` | management key | 201 `{"key": "<the new key, shown once>", "data": {…}, "rotated": {hash, expires_at}}`: a key of the same name, account and terms; the old one works for the grace (default an hour), then is refused 401 `rotated_key`; a management key's only by the operator (else 403 `operator_only`); 409 `already_rotated`; 422 for a disabled or leaked key |
//! | `POST /api/v1/keys/{hash}/leaked` `{url?, source?}` | management key | `{"data": {…}}`: the key revoked and disabled for good, its owner told ([`KeyRoutesLayer::leak_notifier`]); the calling key itself is 409 `own_key` |
//! | `POST /api/v1/auth/keys/code` `{callback_url, code_challenge, code_challenge_method, limit?, limit_reset?, expires_at?, key_label?, account?}` | management key | 201 `{"data": {id, created_at, expires_at}}`: an app's OAuth code ([`oauth`](crate::oauth), whose `CodeExchange` answers `POST /api/v1/auth/keys`) |
//! | `POST /api/v1/accounts` `{id, name?, email?}` | operator | 201 `{"data": {id, name, email, created_at, balance, total_credits, total_usage}}`; 422 `account_exists` |
//! | `GET /api/v1/accounts?offset=` | management key | `{"data": [{…}, …]}`: every account for the operator, its own for an account's key |
//! | `GET /api/v1/accounts/{id}` | operator, or that account's management key | `{"data": {…, is_free_tier, free_model_daily_requests}}` |
//! | `POST /api/v1/accounts/{id}/credits` `{amount}`, header `Idempotency-Key?` | operator | `{"data": {account, total_credits, total_usage, balance}}`; with a key, once per key ([`input::idempotency_key`], [`LedgerStore::top_up_once`](crate::store::LedgerStore::top_up_once)): a retry answers the same, another amount is 422 |
//! | `GET /api/v1/accounts/{id}/byok` | operator, or a key of that account | `{"data": [{provider, hint, created_at, updated_at}, …]}` |
//! | `PUT /api/v1/accounts/{id}/byok/{provider}` `{key}` | operator, or that account's management key | `{"data": {provider, hint, created_at, updated_at}}`, never the key |
//! | `DELETE /api/v1/accounts/{id}/byok/{provider}` | operator, or that account's management key | `{"deleted": true}`, or 404 |
//!
//! "Who" is the route's caller class in the table, checked once before
//! its handler runs: *any key*; *a key of that account* (the path's
//! `{id}`) or the operator's; *management key* (the operator's for every
//! account, an account's for its own: the handler keeps it there); *that
//! account's management key* or the operator's; the *operator* alone. A
//! normal key on a management route is 403 `management_key_required`,
//! another account's key 403 `other_account`, an account's management
//! key on the operator's routes 403 `operator_only`.
//!
//! On every `/api/v1/accounts/{id}…` route an `id` that no account has
//! (made by `POST /api/v1/accounts`; `default` always exists) is 404
//! `unknown_account`: no route but that one makes an account, so nothing
//! is credited or stored for a mistyped id.
//!
//! There are two kinds of management key. The **operator's** (the proxy's
//! `MODELGATE_ADMIN_KEY`, or one made with [`KeyDirectory::create_key`])
//! manages every account: it creates and tops up accounts and creates an
//! account's management key (`"management": true` with `"account"`). It
//! belongs to no tenant account: it is recorded on [`OPERATOR_ACCOUNT`], an
//! id no account can take, so only an operator's key lists, reads, changes
//! or reports it ([`KeyDirectory::move_operator_keys`] moves those an older
//! store keeps on `default`). An **account's** management key manages that
//! account only: its keys (created in it whatever `account` says, else 403
//! `other_account`), its provider keys, its balance and usage; another
//! account's keys are 404 to it, and what only the operator does is 403
//! `operator_only`. Neither kind can call models. Inference keys read only
//! themselves. Every key listed says whether it is the `current` one, the
//! calling key, which cannot disable, delete or report itself (409
//! `own_key`: whoever uses it would be locked out; rotate instead).
//!
//! The BYOK routes keep an account's own provider keys in a
//! [`ByokDirectory`]; once set, a key is never answered again, only its
//! hint (`sk-…abcd`). [`CreditGuardLayer::byok_directory`] makes the
//! account's requests to that provider BYOK and hands the key to the
//! upstream client as a [`ByokCredential`]. A key is accepted only for the
//! providers [`KeyRoutesLayer::byok_providers`] names (any, by default):
//! those the service below really sends it to in place of its own
//! credential (the proxy: those with `"byok": true`).
//!
//! Every request an account's keys make to these routes (an inference
//! key's to the usage routes) counts against its account's management
//! rate, decided in the store so it
//! holds across instances ([`KeyRoutesLayer::management_rate`], default
//! [`DEFAULT_MANAGEMENT_RATE`]: 600 a minute, bursts of 60); past it, 429
//! with `limit_source` `management_rate` and `Retry-After`. The operator's
//! key is not counted: it must still work while a tenant floods the API.
//!
//! Each key shows `last_used_at` (written at most once a minute, so it may
//! lag that much), `hint` (its first and last few characters,
//! [`ApiKey::hint`](crate::keys::ApiKey::hint)) and `leak` (`null`, or
//! when, where and by whom it was reported leaked). `PATCH` takes
//! `{name?, disabled?, limit?, limit_reset?, include_byok_in_limit?,
//! expires_at?, allowed_models?, rate_limit?}`; `expires_at: null` makes
//! the key never expire, `allowed_models: null` lets it call every model
//! and `rate_limit: null` leaves it the account's rules only. A key the
//! operator disabled is enabled again by the operator only (403
//! `operator_only`). Disabling or reporting leaked a rotated key still in
//! its grace does the same to its successors: whoever holds it may have
//! made them.
//!
//! Credits are JSON numbers (`12.5`); in the store they are nano-credits.
//! Usage periods are UTC: the day, the week from Monday, the month. A key
//! deleted or disabled through one instance is refused at once there and
//! within the directory's cache time (default 1 s) everywhere else. A key
//! reported leaked is refused at once everywhere: it is revoked in the
//! ledger, which every chat admission reads, and the other routes read a
//! live key afresh ([`KeyDirectory::lookup_live`]).
//!
//! [`KeyDirectory::create_key`]: crate::keys::KeyDirectory::create_key
//! [`OPERATOR_ACCOUNT`]: crate::keys::OPERATOR_ACCOUNT
//! [`KeyDirectory::move_operator_keys`]: crate::keys::KeyDirectory::move_operator_keys
//! [`ByokDirectory`]: crate::keys::ByokDirectory
//! [`ByokCredential`]: crate::keys::ByokCredential
//! [`KeyDirectory::lookup_live`]: crate::keys::KeyDirectory::lookup_live
//! [`CreditGuardLayer::byok_directory`]: crate::credit::CreditGuardLayer::byok_directory
//! [`input::idempotency_key`]: crate::keys::input::idempotency_key
//!
//! The layers go `BearerAuth -> BodyLimit -> KeyRoutes -> …`:
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::api::KeyRoutesLayer;
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store);
//! // The operator's first management key comes from the library, not the API.
//! let admin = NewKey { management: true, ..NewKey::named("operator") };
//! let (admin_key, _) = directory.create_key(admin).await.unwrap();
//!
//! let gateway = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory.clone()))
//!     .layer(BodyLimitLayer::new())
//!     .layer(KeyRoutesLayer::new(directory))
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("upstream"))))
//!     }));
//!
//! let create = Request::post("/api/v1/keys")
//!     .header("authorization", format!("Bearer {}", admin_key.expose()))
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(r#"{"name": "ci", "limit": 5, "limit_reset": "daily"}"#)))
//!     .unwrap();
//! let response = gateway.clone().oneshot(create).await.unwrap();
//! assert_eq!(response.status(), 201);
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! let created: serde_json::Value = serde_json::from_slice(&body).unwrap();
//! let new_key = created["key"].as_str().unwrap();
//!
//! let status = Request::get("/api/v1/key")
//!     .header("authorization", format!("Bearer {new_key}"))
//!     .body(Full::new(Bytes::new()))
//!     .unwrap();
//! let body = gateway.oneshot(status).await.unwrap().into_body().collect().await.unwrap().to_bytes();
//! let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
//! assert_eq!(status["data"]["label"], "ci");
//! assert_eq!(status["data"]["limit_remaining"], 5);
//! assert_eq!(status["data"]["free_model_daily_requests"]["limit"], 50);
//! # }
//! ```

mod accounts;
mod answers;
mod byok;
#[cfg(feature = "csv")]
mod csv_export;
mod keys;
mod layer;
mod management_rate;
mod mounted;
#[cfg(test)]
mod permission_matrix;
mod routes;
mod service;
mod usage;

pub use crate::answer::AnswerFuture as ResponseFuture;
pub use layer::KeyRoutesLayer;
pub use management_rate::DEFAULT_MANAGEMENT_RATE;
pub use mounted::{MountedBody, MountedKeyRoutes};
pub use service::KeyRoutes;
