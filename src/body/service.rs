use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::BodyLimitConfig;
use super::prepare::too_large;
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::{BoxError, ResponseBody};

/// Buffers the request body once into `Bytes` (413 when too large, 408 when
/// too slow), parses chat-completions requests into a
/// [`ChatRequest`](super::ChatRequest), and calls the inner service with
/// the same bytes as a [`Full`] body.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug)]
pub struct BodyLimit<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<BodyLimitConfig>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BodyLimit<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone,
    ReqBody: Body,
    ReqBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is asked for readiness only once the body is in,
        // so a slow client never holds a concurrency permit while it uploads.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let inner = self.inner.clone();
        let max_body_bytes = self.config.max_body_bytes;
        if let Some(rejection) = check_content_length(&request, max_body_bytes) {
            return ResponseFuture::rejected(rejection);
        }
        let (parts, body) = request.into_parts();
        let collect = Limited::new(body, max_body_bytes).collect();
        ResponseFuture::buffering(
            parts,
            collect,
            self.config.read_timeout,
            max_body_bytes,
            Arc::clone(&self.config.model_names),
            inner,
        )
    }
}

/// A declared length over the limit is refused before a byte is read.
fn check_content_length<B>(request: &Request<B>, max_body_bytes: usize) -> Option<GatewayError> {
    let declared = request.headers().get(CONTENT_LENGTH)?;
    match declared
        .to_str()
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
    {
        None => Some(GatewayError::new(
            ErrorKind::InvalidRequest,
            "the Content-Length header is not a number",
        )),
        Some(length) if length > max_body_bytes as u64 => Some(too_large(max_body_bytes)),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http::header::CONTENT_TYPE;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full, StreamBody};
    use proptest::prelude::*;
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    use crate::body::BodyLimitLayer;
    use crate::context::RequestContext;

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
        // Not JSON, not a model call's path: passed on untouched.
        let request = Request::post("/api/v1/images/generations")
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
