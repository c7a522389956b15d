//! OAuth keys for apps: a person lets an app use their account, and the
//! app gets a key of its own, with the credit limit and expiry the person
//! chose, without ever seeing the person's keys. The flow is OpenRouter's
//! PKCE flow (RFC 7636), so apps written for it work unchanged:
//!
//! 1. The app makes a random `code_verifier` and sends the person's
//!    browser to `GET /auth?callback_url=…&code_challenge=…&code_challenge_method=S256`
//!    (the challenge being base64url(SHA-256(verifier)), [`s256_challenge`]).
//! 2. The consent page ([`SettingsPage`](crate::settings::SettingsPage)
//!    serves it) names the app by its callback URL's origin, asks for a
//!    management key as the key settings page does, and offers an
//!    optional credit limit, limit reset and expiry. **Authorize** calls
//!    `POST /api/v1/auth/keys/code` and sends the browser to the callback
//!    URL with `code=<code>` added to its query; **Deny** sends it there
//!    with `error=access_denied` instead.
//! 3. The app posts `{code, code_verifier, code_challenge_method}` to
//!    `POST /api/v1/auth/keys` and gets `{"key", "user_id"}`: a new
//!    inference key of the account, named after the app.
//!
//! | method and path | who | answer |
//! |---|---|---|
//! | `GET /auth?callback_url=&code_challenge=&code_challenge_method=` | a person's browser | the consent page (`SettingsPage`) |
//! | `POST /api/v1/auth/keys/code` `{callback_url, code_challenge, code_challenge_method, limit?, limit_reset?, expires_at?, key_label?, account?}` | management key (behind BearerAuth, answered by the JSON API's `KeyRoutes`) | 201 `{"data": {"id": "<code>", "created_at", "expires_at"}}` |
//! | `POST /api/v1/auth/keys` `{code, code_verifier, code_challenge_method?}` | anyone holding a code and its verifier ([`CodeExchange`], before BearerAuth) | 200 `{"key": "<plaintext, shown once>", "user_id": "<account>"}` |
//!
//! **Approving** (`…/code`): `callback_url` must be `https://`, or
//! `http://` on `localhost`, `127.0.0.1` or `[::1]` ([`CallbackUrl`]);
//! `code_challenge_method` must be `S256`: `plain`, or no method (which
//! RFC 7636 reads as `plain`), is 400 (`plain_pkce_refused`,
//! `pkce_method_required`), since with `plain` the verifier itself
//! travels in the consent page's URL, unless the operator allows it
//! (`KeyRoutesLayer::plain_pkce`);
//! the consent page sends the method the app named;
//! `limit`, `limit_reset` and `expires_at` read as in
//! `POST /api/v1/keys`; `key_label` names the key (default: the callback
//! URL's host). The operator's key must name the `account` (422
//! `account_required`, or `unknown_account` for one that does not exist);
//! an account's management key approves for its own account only (403
//! `other_account`). An inference key gets 403. Nothing is created in the
//! account yet. One account has at most
//! [`DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT`] (100) codes waiting for their
//! exchange (`KeyRoutesLayer::max_pending_codes_per_account`);
//! past it an approval is 429 `too_many_pending_codes_for_account` with
//! `Retry-After` (until its oldest code expires), so one account cannot
//! take the gateway-wide [`MAX_PENDING_CODES`] from the others.
//!
//! **Exchanging** (`POST /api/v1/auth/keys`): a body that is no JSON
//! object, a missing `code` or `code_verifier`, a verifier that is not 43
//! to 128 characters of `A-Z a-z 0-9 - . _ ~`, or a method other than
//! `S256` and `plain` is 400. A code that is malformed, unknown or expired
//! (403 `invalid_code`), used (403 `code_used`), asked for with another
//! method than it was made with (403 `method_mismatch`; an absent method
//! means the code's own) or with a verifier that does not answer its
//! challenge (403 `verifier_mismatch`) gives nothing, and each such 403
//! counts as a failed authentication of the client's address
//! ([`CodeExchangeLayer::failure_limit`], shared with BearerAuth): past the
//! limit they are 429 `auth_failures`. A refused exchange does not spend
//! the code. The answer allows any origin to read it
//! (`Access-Control-Allow-Origin: *`; `OPTIONS` answers the preflight), so
//! an app running in a browser can exchange its code; no cookie or other
//! credential of the gateway takes part.
//!
//! **Codes** ([`AuthCode`]) are 256 random bits in 43 base64url
//! characters. The store keeps only their SHA-256, as records of
//! [`AUTH_CODES`] written with a lifetime of [`CODE_LIFETIME`] (10
//! minutes; the gateway's clock is checked too), so they work across every
//! instance sharing a Redis; each also holds a place among its account's
//! waiting codes ([`pending_codes`], capped by the store's atomic write)
//! until it is exchanged or expires. A code is exchanged once: the exchange marks
//! it used by a compare-and-set write on the revision it read, and only
//! then creates the key, so two exchanges racing for one code (on one
//! instance or two) give exactly one key; the other is told `code_used`.
//! The verifier is compared in constant time ([`verifier_matches`]). A
//! store failure after the code was taken is a 503 and costs the code; the
//! app sends the person through the consent page again.
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
//! use modelgate::oauth::{s256_challenge, CodeExchangeLayer};
//! use modelgate::store::MemoryStore;
//! use serde_json::{json, Value};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store);
//! // The person's management key, for their account `acme`.
//! let manager = NewKey {
//!     account: "acme".into(),
//!     management: true,
//!     scoped_to_account: true,
//!     ..NewKey::named("acme admin")
//! };
//! let (manager, _) = directory.create_key(manager).await.unwrap();
//!
//! // The exchange comes before BearerAuth: the app has no key yet.
//! let gateway = ServiceBuilder::new()
//!     .layer(CodeExchangeLayer::new(directory.clone()))
//!     .layer(BearerAuthLayer::new(directory.clone()))
//!     .layer(BodyLimitLayer::new())
//!     .layer(KeyRoutesLayer::new(directory))
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
//!     }));
//! let send = |request: Request<Full<Bytes>>| {
//!     let gateway = gateway.clone();
//!     async move {
//!         let response = gateway.oneshot(request).await.unwrap();
//!         let status = response.status();
//!         let body = response.into_body().collect().await.unwrap().to_bytes();
//!         (status, serde_json::from_slice::<Value>(&body).unwrap())
//!     }
//! };
//!
//! // The app's secret, and the challenge it sends through the browser.
//! let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
//! let challenge = s256_challenge(verifier);
//!
//! // What the consent page posts when the person clicks Authorize.
//! let approve = json!({
//!     "callback_url": "https://app.example.com/callback",
//!     "code_challenge": challenge,
//!     "code_challenge_method": "S256",
//!     "limit": 5,
//!     "limit_reset": "monthly",
//! });
//! let (status, approved) = send(
//!     Request::post("/api/v1/auth/keys/code")
//!         .header("authorization", format!("Bearer {}", manager.expose()))
//!         .body(Full::new(Bytes::from(approve.to_string())))
//!         .unwrap(),
//! )
//! .await;
//! assert_eq!(status, 201);
//! let code = approved["data"]["id"].as_str().unwrap();
//!
//! // The app, back at its callback with `?code=…`, exchanges it.
//! let exchange = json!({"code": code, "code_verifier": verifier, "code_challenge_method": "S256"});
//! let exchange = || {
//!     Request::post("/api/v1/auth/keys")
//!         .body(Full::new(Bytes::from(exchange.to_string())))
//!         .unwrap()
//! };
//! let (status, answer) = send(exchange()).await;
//! assert_eq!(status, 200);
//! assert_eq!(answer["user_id"], "acme");
//! let app_key = answer["key"].as_str().unwrap();
//!
//! // The key is the account's, named after the app, with the limit approved.
//! let (_, status) = send(
//!     Request::get("/api/v1/key")
//!         .header("authorization", format!("Bearer {app_key}"))
//!         .body(Full::default())
//!         .unwrap(),
//! )
//! .await;
//! assert_eq!(status["data"]["label"], "app.example.com");
//! assert_eq!(status["data"]["limit"], 5);
//! assert_eq!(status["data"]["limit_reset"], "monthly");
//!
//! // A code gives one key.
//! let (status, refused) = send(exchange()).await;
//! assert_eq!(status, 403);
//! assert_eq!(refused["error"]["metadata"]["reason"], "code_used");
//! # }
//! ```

mod code;
pub mod input;
mod issue;
mod layer;
mod pkce;
mod service;

pub use crate::answer::AnswerFuture as ResponseFuture;
pub use code::{
    AUTH_CODES, Approval, AuthCode, AuthCodes, CODE_LIFETIME,
    DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT, ExchangeError, ExchangeRefusal, IssueError, IssuedCode,
    MAX_PENDING_CODES, pending_codes,
};
pub use input::{CallbackUrl, CallbackUrlError, CodeRequest, ExchangeRequest};
pub use issue::CONSENT_PATH;
pub(crate) use issue::{ApprovalRules, issue_code};
pub use layer::CodeExchangeLayer;
pub use pkce::{
    ChallengeMethod, MAX_VERIFIER_CHARS, MIN_VERIFIER_CHARS, PlainPkce, S256_CHALLENGE_CHARS,
    is_valid_challenge, is_valid_verifier, s256_challenge, verifier_matches,
};
pub use service::CodeExchange;
