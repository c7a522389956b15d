//! The key settings page: [`SettingsPage`] serves a small web page at
//! `/settings` where a person signs in with a management key and manages
//! keys: the account's balance, free tier and free-model requests left
//! today; a table of keys with their limits, usage and last use; creating
//! a key (its plaintext shown once), changing its name, limit, reset
//! period or disabled state, and deleting it. A key reported leaked is
//! marked so, and a notice above the table says when, by whom and where
//! it was found, with a button that fills in the creation form for its
//! replacement and one that deletes it; it is never offered to be
//! enabled again. With the operator's key it also lists
//! the accounts, tops them up and creates accounts and their management
//! keys. Below the keys, the account's activity (credits spent per UTC
//! day and model over 30 days, an SVG chart beside a table of the same
//! figures), its recent generations (time, key,
//! model, tokens, cost, status, app) and its own apps ranked for today,
//! this week or this month ([`usage`](crate::usage)); with the operator's
//! key, those of the account it chose to show.
//!
//! The page is static HTML, CSS and JavaScript compiled into the crate
//! (no CDN, no build step; it works offline). It talks to the gateway's
//! JSON API (the [`keys`](crate::keys) and [`usage`](crate::usage)
//! tables) from the browser with
//! `fetch()` and `Authorization: Bearer <management key>`, so it needs no
//! session of its own: the key stays in the tab's `sessionStorage`, never
//! in a cookie or a URL, and is gone when the tab closes or the person
//! signs out.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET`, `HEAD /settings` | the page, `text/html; charset=utf-8` |
//! | `GET`, `HEAD /settings/app.js`, `/settings/api.js`, `/settings/activity.js`, `/settings/app.css`, `/settings/icon.svg` | its scripts, style sheet and icon |
//! | `GET`, `HEAD /auth?callback_url=…&code_challenge=…&code_challenge_method=…`, `/settings/auth.js` | the OAuth consent page and its script ([`oauth`](crate::oauth)): the same sign-in and key, then **Authorize** or **Deny** for the app |
//! | another method on those paths | 405 with `Allow: GET, HEAD` |
//! | any other path under `/settings/` | 404 |
//! | everything else | passed to the inner service untouched |
//!
//! Refusals are in the canonical error format
//! ([`GatewayError::to_response`](crate::error::GatewayError::to_response)).
//! Paths are read as every route check in the crate reads them
//! (percent-decoded, dot segments applied, `settings` in any case).
//!
//! Every response the layer writes carries [`CONTENT_SECURITY_POLICY`]
//! (scripts, styles, images and `fetch()` from the gateway's own origin
//! only; no inline script or style, no framing, no form posts),
//! `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
//! `X-Frame-Options: DENY` and `Cache-Control: no-store`: after an upgrade
//! the page and its script always match, and nothing of it sits in a
//! shared cache. The JSON API adds no CORS headers (but for the OAuth code
//! exchange, which takes no credential), so only the page's own origin can
//! call it from a browser.
//!
//! The page needs nothing from the layers below it, so it goes early in
//! the stack, before authentication: the gateway
//! ([`build_gateway`](crate::proxy::build_gateway)) puts it right after
//! `ClientAddr`. Open `http://HOST/settings` and paste a management
//! key.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::settings::{SettingsPageLayer, CONTENT_SECURITY_POLICY};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let service = ServiceBuilder::new()
//!     .layer(SettingsPageLayer::new())
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("the API"))))
//!     }));
//!
//! let page = service.clone().oneshot(Request::get("/settings").body(Full::default()).unwrap()).await.unwrap();
//! assert_eq!(page.status(), 200);
//! assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
//! assert_eq!(page.headers()["content-security-policy"], CONTENT_SECURITY_POLICY);
//! let html = page.into_body().collect().await.unwrap().to_bytes();
//! assert!(html.starts_with(b"<!doctype html>"));
//!
//! let post = Request::post("/settings").body(Full::default()).unwrap();
//! let refused = service.clone().oneshot(post).await.unwrap();
//! assert_eq!(refused.status(), 405);
//! assert_eq!(refused.headers()["allow"], "GET, HEAD");
//!
//! let api = service.oneshot(Request::get("/api/v1/key").body(Full::default()).unwrap()).await.unwrap();
//! assert_eq!(api.into_body().collect().await.unwrap().to_bytes(), "the API");
//! # }
//! ```
//!
//! In an axum application the layer goes on the router; the page then
//! calls that application's `/api/v1` routes, so the key routes
//! ([`KeyRoutesLayer`](crate::api::KeyRoutesLayer) behind
//! [`BearerAuthLayer`](crate::auth::BearerAuthLayer)) must be served there
//! too:
//!
//! ```
//! use axum::{routing::get, Router};
//! use http::Request;
//! use modelgate::settings::SettingsPageLayer;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let app: Router = Router::new()
//!     .route("/health", get(|| async { "ok" }))
//!     .layer(SettingsPageLayer::new());
//!
//! let request = Request::get("/settings/app.js").body(axum::body::Body::empty()).unwrap();
//! let script = app.oneshot(request).await.unwrap();
//! assert_eq!(script.status(), 200);
//! assert_eq!(script.headers()["content-type"], "text/javascript; charset=utf-8");
//! # }
//! ```

mod layer;
mod service;

pub use crate::answer::AnswerFuture as ResponseFuture;
pub use layer::SettingsPageLayer;
pub use service::{CONTENT_SECURITY_POLICY, PATH, SettingsPage};
