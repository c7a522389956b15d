//! `ErrorMapper`: the outermost layer, so a client never sees a reset
//! connection, an HTML page or an error body in a shape it cannot read.
//!
//! - An inner `Err` becomes 504 (a timeout), 503 (overload) or 502
//!   (connection refused or reset, anything else).
//! - A panic in an inner service becomes 500.
//! - An error response (4xx, 5xx) whose body is already canonical passes
//!   through byte for byte; any other (HTML, plain text, other JSON shapes,
//!   empty) is rewritten into the canonical body with the upstream's status,
//!   its `Retry-After` and `X-RateLimit-*` headers, and its own message in
//!   `metadata.upstream_message`, truncated.
//! - Successful responses stream through untouched.
//! - On the Messages API's paths (`…/messages`, `…/messages/count_tokens`)
//!   every error is in Anthropic's shape instead, `{"type": "error",
//!   "error": {"type", "message", "metadata"}}`, its type the one Anthropic
//!   gives the status (a 402 `billing_error`), as Anthropic's SDKs read it;
//!   an upstream's own error in that shape passes as it is.
//!
//! Its error type is [`Infallible`](std::convert::Infallible), so it ends
//! a stack that axum or hyper can serve directly.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::error_mapper::ErrorMapperLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let upstream = service_fn(|_request: Request<Full<Bytes>>| async {
//!     let page = Full::new(Bytes::from_static(b"<html><h1>502 Bad Gateway</h1></html>"));
//!     Ok::<_, std::io::Error>(Response::builder().status(502).body(page).unwrap())
//! });
//! let service = ServiceBuilder::new().layer(ErrorMapperLayer::new()).service(upstream);
//!
//! let response = service.oneshot(Request::new(Full::new(Bytes::new()))).await.unwrap();
//! assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
//! assert_eq!(json["error"]["type"], "upstream_error");
//! assert_eq!(json["error"]["metadata"]["upstream_message"], "502 Bad Gateway");
//! # }
//! ```

mod anthropic;
mod future;
mod inner;
mod layer;
mod service;
mod upstream;

pub use future::ResponseFuture;
pub use layer::ErrorMapperLayer;
pub use service::ErrorMapper;
pub use upstream::canonical_upstream_error;
