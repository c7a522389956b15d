//! [`InFlightLimit`]: a bound on the requests a service works on at once.
//! Past it a request is answered at once with 503 `service_unavailable`
//! and `Retry-After: 1`, instead of queueing without bound, so the
//! requests within the bound keep their latency.
//!
//! A request counts from the moment it arrives until its response body
//! has ended (or is dropped): a stream that runs for minutes holds its
//! place for those minutes, as the work it causes does.
//!
//! tower's `ConcurrencyLimit` and `LoadShed` come close, but the first
//! lets a request go once its response headers are out, and the second
//! fails with an error rather than answering; this layer answers with the
//! canonical error body and counts the whole response.
//!
//! In the proxy the places are taken after authentication, so requests
//! without a good key never hold one. The endpoints that must read a body
//! before anyone is authenticated (the OAuth code exchange, secret-scanning
//! alerts, the webhook routes) each have their own small bound instead,
//! a bound per client address, and a least rate for the body:
//! [`UnauthenticatedLimits`], held through [`UnauthenticatedPlaces`].
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use modelgate::in_flight::InFlightLimitLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let slow = service_fn(|_: Request<Full<Bytes>>| async {
//!     tokio::time::sleep(Duration::from_millis(50)).await;
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("done"))))
//! });
//! let service = ServiceBuilder::new().layer(InFlightLimitLayer::new(1)).service(slow);
//!
//! let request = || Request::post("/").body(Full::new(Bytes::new())).unwrap();
//! let first = tokio::spawn(service.clone().oneshot(request()));
//! tokio::task::yield_now().await;
//! let second = service.clone().oneshot(request()).await.unwrap();
//! assert_eq!(second.status(), 503);
//! assert_eq!(second.headers()["retry-after"], "1");
//! let first = first.await.unwrap().unwrap();
//! assert_eq!(first.status(), 200);
//! // The first response is still being read: its place is held until its body ends.
//! assert_eq!(service.clone().oneshot(request()).await.unwrap().status(), 503);
//! drop(first);
//! assert_eq!(service.oneshot(request()).await.unwrap().status(), 200);
//! # }
//! ```

mod body;
mod future;
mod layer;
mod service;
mod unauthenticated;

pub use body::InFlightBody;
pub use future::ResponseFuture;
pub use layer::InFlightLimitLayer;
pub use service::InFlightLimit;
pub use unauthenticated::{UnauthenticatedLimits, UnauthenticatedPlace, UnauthenticatedPlaces};
