use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;

use futures_util::future::BoxFuture;
use http::header::{CONTENT_LENGTH, HeaderValue};
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower_service::Service;

use super::body::MeteredBody;
use super::bound::edit_request_body;
use super::meter::{Ending, Unsettled};
use super::service::Admitted;
use super::stream::StreamEdits;
use super::usage::{BodyKind, UsageScanner};
use crate::context::RequestContext;
use crate::edit::{ModelNamed, NameModel, ServedModel};
use crate::error::GatewayError;
use crate::limiter::Additions;
use crate::limiter::headers::{RateHeaders, merge_response_headers};
use crate::response_body::ResponseBody;
use crate::usage::{GENERATION_ID_HEADER, generation_id};

pin_project! {
    /// Response future of [`CreditGuard`](super::CreditGuard): the
    /// reservation, then the inner service, then a metered body.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Rejected {
            error: Option<GatewayError>,
        },
        Admitting {
            admitting: BoxFuture<'static, Result<Admitted, GatewayError>>,
            request: Option<Request<B>>,
            inner: Option<S>,
            max_scanned_body_bytes: usize,
        },
        Calling {
            #[pin]
            future: Oneshot<S, Request<B>>,
            meter: Unsettled,
            max_scanned_body_bytes: usize,
            response_headers: Vec<RateHeaders>,
            hide_stream_usage: bool,
            // The model a stream is to name (asked by the layer above).
            name_model: Option<std::sync::Arc<str>>,
            generation_id: Option<http::HeaderValue>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn rejected(error: GatewayError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
        }
    }

    pub(crate) fn unmetered(request: Request<B>, inner: S) -> Self {
        ResponseFuture {
            state: State::Calling {
                future: Oneshot::new(inner, request),
                meter: Unsettled::new(None, Ending::Abandoned),
                max_scanned_body_bytes: 0,
                response_headers: Vec::new(),
                hide_stream_usage: false,
                name_model: None,
                generation_id: None,
            },
        }
    }

    pub(crate) fn admitting(
        admitting: BoxFuture<'static, Result<Admitted, GatewayError>>,
        request: Request<B>,
        inner: S,
        max_scanned_body_bytes: usize,
    ) -> Self {
        ResponseFuture {
            state: State::Admitting {
                admitting,
                request: Some(request),
                inner: Some(inner),
                max_scanned_body_bytes,
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    B: From<Bytes>,
{
    type Output = Result<Response<ResponseBody<MeteredBody<ResBody>>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProjection::Rejected { error } => {
                    let error = error.take().expect("polled after completion");
                    crate::telemetry::layer_decision("CreditGuard", Some(&error));
                    return Poll::Ready(Ok(error.to_response()));
                }
                StateProjection::Admitting {
                    admitting,
                    request,
                    inner,
                    max_scanned_body_bytes,
                } => {
                    let outcome = ready!(admitting.as_mut().poll(cx));
                    let (Some(mut request), Some(inner)) = (request.take(), inner.take()) else {
                        panic!("polled after completion");
                    };
                    let next = match outcome {
                        Ok(Admitted {
                            mut meter,
                            credential,
                            additions,
                            body_edits,
                            hide_stream_usage,
                            sent,
                        }) => {
                            crate::telemetry::layer_decision("CreditGuard", None);
                            let mut response_headers = Vec::with_capacity(additions.len());
                            for admission in additions {
                                admission.additions.add_to(&mut request);
                                response_headers.push(admission.response_headers);
                            }
                            let context = RequestContext::of_mut(&mut request);
                            if credential.is_some() {
                                // For the upstream client, which sends it
                                // instead of the gateway's own key.
                                context.credential = credential;
                            }
                            if sent.is_some() {
                                context.sent.clone_from(&sent);
                            }
                            let edited = body_edits.and_then(|edits| {
                                edit_request_body(context.body.as_ref()?, &edits)
                            });
                            if let Some(edited) = edited {
                                // Later layers and the upstream read the
                                // bytes that go upstream.
                                context.body = Some(edited.clone());
                                request.headers_mut().remove(CONTENT_LENGTH);
                                *request.body_mut() = B::from(edited);
                            }
                            // The record's id, and when the upstream call began.
                            let generation_id = meter.as_mut().and_then(|meter| {
                                let generation = meter.generation.as_mut()?;
                                generation.sent = Some(tokio::time::Instant::now());
                                HeaderValue::from_str(&generation_id(&meter.reservation_id)).ok()
                            });
                            let name_model = request
                                .extensions()
                                .get::<NameModel>()
                                .map(|NameModel(model)| std::sync::Arc::clone(model));
                            State::Calling {
                                generation_id,
                                name_model,
                                future: Oneshot::new(inner, request),
                                // Dropped before the response: the upstream
                                // may be working, so the hold is charged,
                                // unless the request is not at the upstream.
                                meter: Unsettled::new(meter, Ending::Abandoned).unless_unsent(sent),
                                max_scanned_body_bytes: *max_scanned_body_bytes,
                                response_headers,
                                hide_stream_usage,
                            }
                        }
                        Err(error) => State::Rejected { error: Some(error) },
                    };
                    state.set(next);
                }
                StateProjection::Calling {
                    future,
                    meter,
                    max_scanned_body_bytes,
                    response_headers,
                    hide_stream_usage,
                    name_model,
                    generation_id,
                } => {
                    let response = match ready!(future.poll(cx)) {
                        Ok(response) => response,
                        Err(error) => {
                            let ending = meter.ending(Ending::InnerFailed);
                            let late = meter.late_answer();
                            if let Some(meter) = meter.take() {
                                match late {
                                    Some(late) => meter.settle_late(late, *max_scanned_body_bytes),
                                    None => meter.settle_in_background(None, ending),
                                }
                            }
                            return Poll::Ready(Err(error));
                        }
                    };
                    // An error answered before the upstream answered (a
                    // timeout, a connection failed once it was sent): the
                    // client has it at once, and the request is settled on
                    // what the upstream still answers. Its record is named.
                    if let Some(late) = meter.late_answer() {
                        if let Some(meter) = meter.take() {
                            meter.settle_late(late, *max_scanned_body_bytes);
                        }
                        let (mut parts, body) = response.into_parts();
                        for headers in response_headers.drain(..) {
                            merge_response_headers(&mut parts, headers);
                        }
                        if let Some(id) = generation_id.take() {
                            parts.headers.insert(GENERATION_ID_HEADER, id);
                        }
                        let body = ResponseBody::inner(MeteredBody::unmetered(body));
                        return Poll::Ready(Ok(Response::from_parts(parts, body)));
                    }
                    if meter.ending(Ending::Complete) == Ending::NotSent {
                        // An answer the layers below made themselves (the
                        // upstream could not be reached): nothing reached
                        // the upstream, so nothing is owed and no record
                        // is kept, nor named.
                        if let Some(meter) = meter.take() {
                            meter.settle_in_background(None, Ending::NotSent);
                        }
                        generation_id.take();
                    }
                    let success = response.status().is_success();
                    let (mut parts, body) = response.into_parts();
                    // Each deferring layer's headers, the tightest limit kept.
                    for headers in response_headers.drain(..) {
                        merge_response_headers(&mut parts, headers);
                    }
                    // The body is read as what it is, whatever was asked for.
                    let event_stream = content_type_is(&parts.headers, "text/event-stream");
                    if let Some(id) = generation_id.take() {
                        parts.headers.insert(GENERATION_ID_HEADER, id);
                    }
                    let body = match meter.take() {
                        Some(mut meter) => {
                            meter.response_success = Some(success);
                            if let Some(generation) = &mut meter.generation {
                                generation.status = Some(parts.status.as_u16());
                                generation.streamed = event_stream;
                            }
                            let api = meter.api;
                            let scanner = match event_stream {
                                true => {
                                    // The usage the gateway asked for is read
                                    // and kept from the client, who did not
                                    // ask for it; each chunk names the model
                                    // the layer above asked for.
                                    let edits = StreamEdits {
                                        hide_usage: *hide_stream_usage && success,
                                        served_model: name_model
                                            .take()
                                            .filter(|_| success)
                                            .map(|model| ServedModel::new(&*model)),
                                    };
                                    if edits.served_model.is_some() {
                                        parts.extensions.insert(ModelNamed);
                                    }
                                    if edits.any() {
                                        // Bytes change: a declared length would be wrong.
                                        parts.headers.remove(CONTENT_LENGTH);
                                    }
                                    UsageScanner::event_stream(edits, *max_scanned_body_bytes)
                                }
                                // A JSON answer only: anything else passes
                                // as it comes, as the layer above passes it.
                                false => match name_model.take().filter(|_| {
                                    success && content_type_is(&parts.headers, "application/json")
                                }) {
                                    // Named here, in the one parse that
                                    // reads the usage; the layer above
                                    // gives the answer its length.
                                    Some(model) => {
                                        parts.extensions.insert(ModelNamed);
                                        parts.headers.remove(CONTENT_LENGTH);
                                        UsageScanner::json_naming(
                                            ServedModel::new(&*model),
                                            *max_scanned_body_bytes,
                                        )
                                    }
                                    None => {
                                        UsageScanner::new(BodyKind::Json, *max_scanned_body_bytes)
                                    }
                                },
                            }
                            .in_api(api);
                            MeteredBody::metered(body, meter, scanner)
                        }
                        // Not charged (nothing reached the upstream): the
                        // gateway asked for no usage, and names no model here.
                        None => MeteredBody::unmetered(body),
                    };
                    return Poll::Ready(Ok(Response::from_parts(parts, ResponseBody::inner(body))));
                }
            }
        }
    }
}

/// Whether `headers` announce a body of media type `essence`.
pub(super) fn content_type_is(headers: &http::HeaderMap, essence: &str) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|announced| announced.trim().eq_ignore_ascii_case(essence))
}
