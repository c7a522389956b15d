use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::try_join_all;
use http::header::{ALLOW, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response};
use http_body::Body;
use tower_service::Service;

use super::layer::LeakAlertsConfig;
use super::{
    GITHUB_KEY_IDENTIFIER, GITHUB_KEY_SIGNATURE, LeakLabel, ReportedToken, SignatureError,
    alert_answer, parse_alert,
};
use crate::answer::AnswerFuture as ResponseFuture;
use crate::auth::{ApiKey, AuthFailures};
use crate::body::ReadError;
use crate::client_addr::ClientAddr;
use crate::error::{ErrorKind, GatewayError};
use crate::keys::{LeakOutcome, LeakReport};
use crate::response_body::{BoxError, ResponseBody};
use crate::routing::path_is;
use crate::store::FailurePolicy;

/// How many of an alert's tokens are looked up at once.
const LOOKUPS_AT_ONCE: usize = 16;

/// Answers `POST /api/v1/leaks`, a code host's secret-scanning alert:
/// checks its signature over the raw body, then each token's format and
/// checksum before any store lookup, revokes and disables every live key
/// among them (refused with 401 `leaked_key` on every instance at once),
/// tells their owners, and answers each token's label. Every other request
/// goes to the inner service untouched. See the [module docs](super).
///
/// Ready when the inner service is: the requests it passes on call it at
/// once (a limit below it holds its own answers too).
#[derive(Clone, Debug)]
pub struct LeakAlerts<S> {
    pub(crate) inner: S,
    pub(crate) config: Option<Arc<LeakAlertsConfig>>,
}

impl<S, B, ResBody> Service<Request<B>> for LeakAlerts<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness: a request passed on is called at
        // once, with no clone of the services below.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(config) = &self.config else {
            return ResponseFuture::passing(self.inner.call(request));
        };
        if !path_is(request.uri().path(), &["api", "v1", "leaks"]) {
            return ResponseFuture::passing(self.inner.call(request));
        }
        let config = Arc::clone(config);
        ResponseFuture::answering(Box::pin(async move {
            match answer(&config, request).await {
                Ok(body) => {
                    let mut response = Response::new(body);
                    response
                        .headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    response
                }
                Err(error) => error.to_response(),
            }
        }))
    }
}

/// The alert's answer, or the refusal: nothing changes unless the
/// signature holds and the whole body parses.
async fn answer<B>(config: &LeakAlertsConfig, request: Request<B>) -> Result<Bytes, GatewayError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    if request.method() != Method::POST {
        return Err(GatewayError::new(
            ErrorKind::MethodNotAllowed,
            "this endpoint answers POST only: a secret-scanning alert",
        )
        .with_header(ALLOW, HeaderValue::from_static("POST")));
    }
    let client = request
        .extensions()
        .get::<ClientAddr>()
        .map(|client| client.0);
    let counted = |rejection: GatewayError| {
        AuthFailures::counted(config.failures.as_ref(), client, rejection)
    };
    // Past its failure limit an address gets no place, no body read and no
    // signature check (the keys' identifiers are public).
    if let Some(failures) = &config.failures
        && let Some(retry_after) = failures.blocked(client)
    {
        return Err(failures.refusal(retry_after));
    }
    // The headers first: an unsigned request or an unknown key costs no
    // body read and no verification.
    let (identifier, signature) = signature_headers(request.headers()).map_err(counted)?;
    if !config.keys.identifiers().any(|known| known == identifier) {
        return Err(counted(unsigned(SignatureError::UnknownIdentifier)));
    }
    // Signed by a known key so far: only now a place and a body read.
    let _place = config.places.enter(client)?;
    let body = config
        .places
        .read_body(request, config.max_body_bytes, config.body_timeout)
        .await
        .map_err(|error| unread(error, config, client))?;
    config
        .keys
        .verify(&identifier, &signature, &body)
        .map_err(|error| counted(unsigned(error)))?;
    let tokens = parse_alert(&body).map_err(|error| {
        GatewayError::new(
            ErrorKind::InvalidRequest,
            format!("the alert is malformed: {error}"),
        )
    })?;
    let mut labels = Vec::with_capacity(tokens.len());
    for batch in tokens.chunks(LOOKUPS_AT_ONCE) {
        let mut lookups = Vec::with_capacity(batch.len());
        for token in batch {
            lookups.push(label(config, token, client));
        }
        labels.extend(try_join_all(lookups).await?);
    }
    Ok(Bytes::from(alert_answer(&tokens, &labels)))
}

/// Whether `token` is a live key of this gateway, now revoked: checked for
/// format and checksum before any lookup, so a string that only looks like
/// a key costs nothing.
async fn label(
    config: &LeakAlertsConfig,
    token: &ReportedToken,
    client: Option<IpAddr>,
) -> Result<LeakLabel, GatewayError> {
    let Ok(key) = ApiKey::parse(&token.token) else {
        return Ok(LeakLabel::FalsePositive);
    };
    let report = LeakReport {
        reported_at: config.directory.now(),
        reported_by: "secret_scanning".to_owned(),
        url: token.url.clone(),
        source: token.source.clone(),
    };
    let outcome = crate::keys::report_leak(
        &config.directory,
        &config.notifier,
        &key.hash(),
        &report,
        &token.token_type,
    )
    .await
    // A store that cannot answer: 503, so the scanner sends the alert again
    // (a report is idempotent).
    .map_err(|error| FailurePolicy::refusal("LeakAlerts", &error))?;
    Ok(match outcome {
        LeakOutcome::Revoked { .. } => {
            tracing::warn!(
                client = ?client,
                url = token.url.as_deref().unwrap_or(""),
                "a live API key was reported leaked; it is revoked"
            );
            LeakLabel::TruePositive
        }
        LeakOutcome::Deleted | LeakOutcome::Unknown => LeakLabel::FalsePositive,
    })
}

/// The key identifier and the signature, or the 401 naming what is missing.
fn signature_headers(headers: &HeaderMap) -> Result<(String, String), GatewayError> {
    let one = |name: &HeaderName| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value
                .to_str()
                .map(str::to_owned)
                .map_err(|_| format!("`{name}` is not visible ASCII")),
            (None, _) => Err(format!("`{name}` is missing")),
            (Some(_), Some(_)) => Err(format!("`{name}` is sent more than once")),
        }
    };
    let checked = one(&GITHUB_KEY_IDENTIFIER)
        .and_then(|identifier| one(&GITHUB_KEY_SIGNATURE).map(|signature| (identifier, signature)));
    checked.map_err(|problem| {
        GatewayError::new(
            ErrorKind::Authentication,
            format!("the alert is not signed: {problem}; alerts are signed with ECDSA P-256 over the raw body"),
        )
        .with_metadata("reason", "unsigned_alert")
    })
}

/// The 401 of a signature that does not hold.
fn unsigned(error: SignatureError) -> GatewayError {
    let reason = match error {
        SignatureError::UnknownIdentifier => "unknown_key_identifier",
        SignatureError::MalformedSignature => "malformed_signature",
        SignatureError::Mismatch => "bad_signature",
    };
    GatewayError::new(
        ErrorKind::Authentication,
        format!("the alert's signature does not hold: {error}"),
    )
    .with_metadata("reason", reason)
}

fn unread(error: ReadError, config: &LeakAlertsConfig, client: Option<IpAddr>) -> GatewayError {
    match error {
        ReadError::TooLarge => GatewayError::new(
            ErrorKind::PayloadTooLarge,
            format!("the alert is over {} bytes", config.max_body_bytes),
        ),
        ReadError::TimedOut => {
            // A trickled body holds a place as a flood does: it counts as
            // a failed authentication.
            if let Some(failures) = &config.failures
                && let Some(retry_after) = failures.record_failure(client)
            {
                return failures.refusal(retry_after);
            }
            config
                .places
                .slow_body("the alert's body", config.body_timeout)
        }
        ReadError::Broken => GatewayError::new(
            ErrorKind::InvalidRequest,
            "the alert's body could not be read to its end",
        ),
    }
}
