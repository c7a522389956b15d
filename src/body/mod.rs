//! `BodyLimit`: the request body buffered once, bounded in size and time,
//! and chat-completions requests parsed into a [`ChatRequest`].
//!
//! The layer reads the whole body into one [`Bytes`] (a declared
//! `Content-Length` over the limit gets 413 before anything is read; a body
//! that runs over while streaming gets 413 too; a body not complete within
//! the read timeout gets 408), then calls the inner service with those same
//! bytes as a [`Full`](http_body_util::Full) body: inner layers and the
//! upstream see exactly what the client sent.
//!
//! For `POST …/chat/completions` the body must be JSON and is parsed once
//! into a [`ChatRequest`] placed in the request's
//! [`crate::context::RequestContext`], with 400 and 422
//! answers for bad input (see [`ChatRequest::parse`]). Every request also
//! gets its bytes there (`RequestContext::body`).
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::context::RequestContext;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let service = ServiceBuilder::new()
//!     .layer(BodyLimitLayer::new().max_body_bytes(64 * 1024))
//!     .service(service_fn(|request: Request<Full<Bytes>>| async move {
//!         let chat = RequestContext::of(&request).and_then(|context| context.chat.as_ref());
//!         let model = chat.unwrap().model.clone();
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(model))))
//!     }));
//!
//! let chat = Request::post("/api/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from_static(br#"{"model":"openai/gpt-4o","messages":[{"role":"user","content":"Hi"}]}"#)))
//!     .unwrap();
//! let response = service.clone().oneshot(chat).await.unwrap();
//! assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "openai/gpt-4o");
//!
//! let too_big = Request::post("/api/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(vec![b' '; 100_000])))
//!     .unwrap();
//! assert_eq!(service.oneshot(too_big).await.unwrap().status(), 413);
//! # }
//! ```

mod drain;
mod future;
mod layer;
// Bodies read before authentication: the endpoints that carry their own
// credential (leak alerts, the OAuth exchange, webhook routes).
#[cfg(any(feature = "flows", feature = "leaks", feature = "oauth"))]
mod read;
mod service;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use http::request::Parts;

// The parsed request lives with the context that carries it.
pub use crate::context::{ChatMessage, ChatRequest, MessageContent, ModelId, Role};
pub use drain::{DrainUnread, DrainUnreadLayer, UnreadDrained};
pub use future::ResponseFuture;
pub use layer::BodyLimitLayer;
#[cfg(any(feature = "flows", feature = "leaks", feature = "oauth"))]
pub(crate) use read::{read_bounded, BodyPace, ReadError};
pub use service::BodyLimit;
// TRANSITIONAL: `proxy/mod.rs`, being restructured elsewhere, still finds
// this here; it lives in `crate::routing`.
#[cfg(feature = "proxy")]
pub(crate) use crate::routing::path_is;

use crate::context::RequestContext;
use crate::error::{ErrorKind, GatewayError};
use crate::routing::is_chat_completions;

fn too_large(max_body_bytes: usize) -> GatewayError {
    GatewayError::new(
        ErrorKind::PayloadTooLarge,
        format!("the request body is larger than the limit of {max_body_bytes} bytes; send a shorter request"),
    )
    .with_metadata("max_body_bytes", max_body_bytes)
}

/// `application/json`, with parameters, or any `…+json` type.
fn is_json(parts: &Parts) -> bool {
    let Some(content_type) = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}

/// Fills the request's context from its buffered body; rejects a chat
/// request that is not JSON or does not parse.
fn prepare_request(parts: &mut Parts, bytes: &Bytes) -> Result<(), GatewayError> {
    let chat = if is_chat_completions(parts) {
        if !is_json(parts) {
            return Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                "chat completions take a JSON body: send `Content-Type: application/json`",
            ));
        }
        Some(ChatRequest::parse(bytes)?)
    } else {
        None
    };
    // The body is now exactly these bytes, whatever framing it came in.
    parts.headers.remove(TRANSFER_ENCODING);
    parts
        .headers
        .insert(CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    let context = RequestContext::in_extensions(&mut parts.extensions);
    context.chat = chat;
    context.body = Some(bytes.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full, StreamBody};
    use proptest::prelude::*;
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    use super::*;

    /// An inner service that answers with the bytes it received and the
    /// parsed model, if any.
    fn echo() -> impl tower::Service<
        Request<Full<Bytes>>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future = impl Send,
    > + Clone {
        service_fn(|request: Request<Full<Bytes>>| async move {
            let model = RequestContext::of(&request)
                .and_then(|context| context.chat.as_ref())
                .map(|chat| chat.model.clone());
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let mut response = Response::new(Full::new(body));
            if let Some(model) = model {
                response
                    .headers_mut()
                    .insert("x-model", model.parse().unwrap());
            }
            Ok::<_, Infallible>(response)
        })
    }

    fn chat_request<B>(body: B) -> Request<B> {
        Request::post("/api/v1/chat/completions")
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_finishes_gets_408_after_the_timeout() {
        let (_sender, receiver) =
            tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, Infallible>>(1);
        let body = StreamBody::new(tokio_stream_from(receiver));
        let service = ServiceBuilder::new()
            .layer(BodyLimitLayer::new().read_timeout(Duration::from_secs(3)))
            .service(echo());
        let started = tokio::time::Instant::now();
        let response = service.oneshot(chat_request(body)).await.unwrap();
        assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    fn tokio_stream_from<T>(
        mut receiver: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> {
        futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
    }

    #[tokio::test]
    async fn a_stream_running_over_the_limit_gets_413_not_an_error() {
        let chunks = (0..10)
            .map(|_| Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(vec![b'x'; 100]))));
        let body = StreamBody::new(futures_util::stream::iter(chunks));
        let service = ServiceBuilder::new()
            .layer(BodyLimitLayer::new().max_body_bytes(999))
            .service(echo());
        let response = service.oneshot(chat_request(body)).await.unwrap();
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // Exactly at the limit is fine.
        let service = ServiceBuilder::new()
            .layer(BodyLimitLayer::new().max_body_bytes(1000))
            .service(echo());
        let chunks = (0..10)
            .map(|_| Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(vec![b' '; 100]))));
        let response = service
            .oneshot(
                Request::post("/other")
                    .body(StreamBody::new(futures_util::stream::iter(chunks)))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_bad_content_length_is_400() {
        let service = ServiceBuilder::new()
            .layer(BodyLimitLayer::new())
            .service(echo());
        let request = Request::post("/x")
            .header(http::header::CONTENT_LENGTH, "ten")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(
            service.oneshot(request).await.unwrap().status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn only_chat_posts_are_parsed() {
        let service = ServiceBuilder::new()
            .layer(BodyLimitLayer::new())
            .service(echo());
        // Not JSON, not a chat path: passed on untouched.
        let request = Request::post("/api/v1/embeddings")
            .body(Full::new(Bytes::from_static(b"not json")))
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("x-model").is_none());
        // A GET of the chat path is not a chat request either.
        let request = Request::get("/api/v1/chat/completions")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(
            service.clone().oneshot(request).await.unwrap().status(),
            StatusCode::OK
        );
        // A trailing slash and a +json type still count.
        let request = Request::post("/v1/chat/completions/")
            .header(CONTENT_TYPE, "application/vnd.api+json")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"a/b","messages":[{"role":"user","content":""}]}"#,
            )))
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        assert_eq!(response.headers()["x-model"], "a/b");
    }

    proptest! {
        #[test]
        fn valid_requests_reach_the_inner_service_byte_identical(
            model in "[a-z]{1,8}/[a-z0-9.-]{1,12}",
            content in any::<String>(),
            padding in "[ \t\n]{0,4}",
        ) {
            let body = format!(
                "{padding}{{\"model\":{},\"messages\":[{{\"role\":\"user\",\"content\":{}}}],\"x-extra\":[1,2]}}{padding}",
                serde_json::to_string(&model).unwrap(),
                serde_json::to_string(&content).unwrap(),
            );
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let response = runtime.block_on(async {
                let service = ServiceBuilder::new().layer(BodyLimitLayer::new()).service(echo());
                service.oneshot(chat_request(Full::new(Bytes::from(body.clone())))).await.unwrap()
            });
            prop_assert_eq!(response.status(), StatusCode::OK);
            prop_assert_eq!(response.headers()["x-model"].to_str().unwrap(), model.as_str());
            let received = runtime.block_on(response.into_body().collect()).unwrap().to_bytes();
            prop_assert_eq!(received, Bytes::from(body));
        }

        #[test]
        fn arbitrary_bodies_never_panic_the_layer(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let status = runtime.block_on(async {
                let service = ServiceBuilder::new().layer(BodyLimitLayer::new().max_body_bytes(200)).service(echo());
                service.oneshot(chat_request(Full::new(Bytes::from(body.clone())))).await.unwrap().status()
            });
            prop_assert!(matches!(status.as_u16(), 200 | 400 | 413 | 422), "{}", status);
            if body.len() > 200 {
                prop_assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
            }
        }
    }
}
