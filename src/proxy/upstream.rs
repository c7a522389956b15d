//! [`Upstream`]: the service at the bottom of the stack, forwarding the
//! buffered request to an OpenAI-compatible upstream and streaming its
//! response back.

use std::borrow::Cow;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{AUTHORIZATION, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_service::Service;

use super::headers::{X_REQUEST_ID, client_response_headers, request_id, upstream_request_headers};
use super::providers::CallerKey;
use crate::context::{LateAnswer, ModelApi, RequestContext, SentUpstream, UpstreamAttempt};
use crate::error::{ErrorKind, GatewayError};
use crate::routing::normalized_segments;
use crate::secrets::Redacted;

/// Where and how to reach the upstream. `Debug` never shows the key or a
/// header's value.
#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    /// The upstream's base URL, its API version included:
    /// `https://api.openai.com/v1`, `http://127.0.0.1:9000/v1`.
    pub base_url: String,
    /// The upstream's own API key, sent as `Authorization: Bearer`; the
    /// client's gateway key never is.
    pub api_key: Option<Redacted<String>>,
    /// The gateway's path prefix, replaced by the base URL's path:
    /// `/api/v1/chat/completions` goes to `{base_url}/chat/completions`.
    pub gateway_prefix: String,
    /// Longest wait for a connection.
    pub connect_timeout: Duration,
    /// Longest wait for the response's status and headers (the body may
    /// stream for longer). Past it the client is answered 504 at once, and
    /// the answer is still read for `late_answer`.
    pub response_header_timeout: Duration,
    /// After the client was answered 504 (`response_header_timeout`), how
    /// long the upstream's answer is still waited for and read, so that
    /// the request is charged what it used; none by then, the request's
    /// hold is charged. Zero: not waited for (the hold is charged at once).
    pub late_answer: Duration,
    /// The most late answers of this upstream waited for at once; past
    /// it, a request that timed out is charged its hold at once.
    pub max_late_answers: usize,
    /// How long an idle pooled connection is kept.
    pub pool_idle_timeout: Duration,
    /// Headers the upstream receives with every request (name, value).
    pub extra_headers: Vec<(String, Redacted<String>)>,
    /// More names of `extra_headers` that carry a credential, beside
    /// [`DEFAULT_CREDENTIAL_HEADERS`]: none of them is sent with a request
    /// that carries an account's own key, which replaces them all.
    pub credential_headers: Vec<String>,
    /// Names of `extra_headers` safe to send beside an account's own key
    /// (BYOK); every other one goes only with the gateway's own key.
    /// Default: none. A credential header cannot be one.
    pub byok_headers: Vec<String>,
    /// The APIs the upstream serves natively (default: chat completions
    /// only); a request in another is translated to one it serves.
    pub apis: ServedApis,
}

/// The APIs an upstream serves natively: `"apis": ["chat", "messages"]`
/// in its configuration (default `["chat", "embeddings"]`). A Messages or
/// Responses request to an upstream that does not serve its API is
/// translated to chat completions and its answer back; a chat request to
/// a Messages-only upstream the reverse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServedApis {
    /// OpenAI's chat completions (`{base_url}/chat/completions`).
    pub chat: bool,
    /// Anthropic's Messages API (`{base_url}/messages`, the key as
    /// `x-api-key`, `anthropic-version` sent).
    pub messages: bool,
    /// OpenAI's Responses API (`{base_url}/responses`).
    pub responses: bool,
    /// Embeddings (`{base_url}/embeddings`).
    pub embeddings: bool,
}

impl Default for ServedApis {
    fn default() -> Self {
        ServedApis {
            chat: true,
            messages: false,
            responses: false,
            embeddings: true,
        }
    }
}

impl ServedApis {
    /// Whether it serves `api` natively.
    pub fn serves(self, api: ModelApi) -> bool {
        match api {
            ModelApi::Chat => self.chat,
            ModelApi::Messages => self.messages,
            ModelApi::Responses => self.responses,
            ModelApi::Embeddings => self.embeddings,
        }
    }

    /// The API a request in `api` goes in: its own when served, else one
    /// it is translated to (chat completions; Messages for a chat request);
    /// `None` when it serves neither.
    pub fn wire_api(self, api: ModelApi) -> Option<ModelApi> {
        if self.serves(api) {
            return Some(api);
        }
        let translated = match api {
            ModelApi::Chat => ModelApi::Messages,
            ModelApi::Messages | ModelApi::Responses => ModelApi::Chat,
            ModelApi::Embeddings => return None,
        };
        self.serves(translated).then_some(translated)
    }

    /// The set `names` (`"chat"`, `"messages"`, `"responses"`,
    /// `"embeddings"`) make; an empty list or an unknown name is refused
    /// with what to write instead.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        let mut served = ServedApis {
            chat: false,
            messages: false,
            responses: false,
            embeddings: false,
        };
        for name in names {
            match name.as_ref() {
                "chat" => served.chat = true,
                "messages" => served.messages = true,
                "responses" => served.responses = true,
                "embeddings" => served.embeddings = true,
                other => {
                    return Err(format!(
                        "{other:?} is not an API this gateway speaks: write \"chat\" (chat completions), \"messages\" (Anthropic's Messages API), \"responses\" (OpenAI's Responses API) or \"embeddings\""
                    ));
                }
            }
        }
        if names.is_empty() {
            return Err("an empty list serves nothing: write [\"chat\"], [\"messages\"], [\"responses\"], [\"embeddings\"] or several".to_owned());
        }
        Ok(served)
    }
}

/// The API a request's body goes to the upstream in, when ChatOnly
/// translated it: the upstream sends its credential as that API takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WireApi(pub(crate) ModelApi);

/// The Anthropic API version sent to a Messages upstream when the client
/// named none (a chat client's request, translated).
pub(crate) const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// The headers that carry a credential whatever the config says: an
/// account's own key (BYOK) is never sent beside one of them.
/// (`Authorization`, the provider key's own header, cannot be configured.)
pub const DEFAULT_CREDENTIAL_HEADERS: [&str; 2] = ["x-api-key", "api-key"];

impl UpstreamConfig {
    /// The default `response_header_timeout`: as long as OpenAI's SDKs
    /// wait, so that a reasoning model's long answer is not cut.
    pub const DEFAULT_RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(600);
    /// The default `late_answer`.
    pub const DEFAULT_LATE_ANSWER: Duration = Duration::from_secs(600);
    /// The default `max_late_answers`.
    pub const DEFAULT_MAX_LATE_ANSWERS: usize = 1024;

    /// Defaults for `base_url`: no key, prefix `/api/v1`, 10 s to connect,
    /// 600 s to the first byte of the response and 600 s more for a late
    /// answer (1024 at once), 90 s idle.
    pub fn new(base_url: impl Into<String>) -> Self {
        UpstreamConfig {
            base_url: base_url.into(),
            api_key: None,
            gateway_prefix: "/api/v1".to_owned(),
            connect_timeout: Duration::from_secs(10),
            response_header_timeout: Self::DEFAULT_RESPONSE_HEADER_TIMEOUT,
            late_answer: Self::DEFAULT_LATE_ANSWER,
            max_late_answers: Self::DEFAULT_MAX_LATE_ANSWERS,
            pool_idle_timeout: Duration::from_secs(90),
            extra_headers: Vec::new(),
            credential_headers: Vec::new(),
            byok_headers: Vec::new(),
            apis: ServedApis::default(),
        }
    }
}

/// The longest [`UpstreamConfig::late_answer`]: a day.
pub const MAX_LATE_ANSWER: Duration = Duration::from_secs(86_400);

/// Why an upstream configuration was refused.
#[derive(Debug, thiserror::Error)]
#[error("upstream: {0}")]
pub struct UpstreamConfigError(String);

/// Forwards requests to the upstream over a pooled HTTP/1 and HTTP/2
/// client (TLS for `https`), and streams each response back as it arrives.
///
/// The path is the one the gateway's layers checked, normalised, with the
/// gateway prefix swapped for the base URL's path, lower case, no query;
/// only allow-listed headers cross either way; `Authorization` is the
/// upstream's own key, or an account's own key (BYOK) sent without any of
/// the credential headers; an
/// `x-request-id` goes up and comes back. Failures are [`GatewayError`]s
/// (502, or 504 for a response-header timeout) with
/// `metadata.upstream_failure` `connect`, `timeout` or `request`, which the
/// retry policy reads.
///
/// A request's [`SentUpstream`] is marked once the upstream has it: when
/// a live connection (TLS done) starts writing its body, or at the latest
/// when a response arrives. It stays unmarked through a failed or slow
/// connect and is cleared on a connect error, so a client that leaves then
/// pays nothing. A pooled connection found dead before the request was
/// written is replaced by a fresh one unmarked; one that fails after the
/// body was handed to it (`request`) or a response that never comes
/// (`timeout`) leave the mark set: the upstream may have read the request
/// and be working on it.
///
/// Such a request is not free. After a timeout the client is answered 504
/// at once, and the response still coming is left as a
/// [`LateAnswer::Coming`] on the request's [`SentUpstream`], waited for
/// and read by CreditGuard for [`UpstreamConfig::late_answer`]
/// (at most [`UpstreamConfig::max_late_answers`] at once; past that, and
/// after a connection failure once the request was sent, a
/// [`LateAnswer::Lost`]: the hold is charged).
#[derive(Clone, Debug)]
pub struct Upstream {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, SendingBody>,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    base_path: String,
    prefix_segments: Vec<String>,
    authorization: Option<HeaderValue>,
    /// The key alone, for the Messages API's `x-api-key`.
    api_key: Option<HeaderValue>,
    apis: ServedApis,
    /// Sent with every request: the ones declared safe for BYOK.
    extra_headers: Vec<(http::HeaderName, HeaderValue)>,
    /// Sent only with the gateway's own key: an account's key replaces
    /// them (every configured header not declared safe for BYOK).
    credential_headers: Vec<(http::HeaderName, HeaderValue)>,
    response_header_timeout: Duration,
    late_answer: Duration,
    /// Places for the late answers waited for at once.
    late_answers: Arc<tokio::sync::Semaphore>,
}

/// What [`Upstream::new`] reads from an [`UpstreamConfig`], checked.
struct CheckedConfig {
    base: Uri,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    extra_headers: Vec<(http::HeaderName, HeaderValue)>,
    credential_headers: Vec<(http::HeaderName, HeaderValue)>,
}

impl UpstreamConfig {
    /// Refuses what [`Upstream::new`] would refuse, but for the API key:
    /// the base URL and the headers. A config reader calls it before the
    /// key is read.
    pub fn check(&self) -> Result<(), UpstreamConfigError> {
        self.checked().map(drop)
    }

    fn checked(&self) -> Result<CheckedConfig, UpstreamConfigError> {
        let config = self;
        let base: Uri = config.base_url.parse().map_err(|error| {
            UpstreamConfigError(format!("{:?} is not a URL: {error}", config.base_url))
        })?;
        let (Some(scheme), Some(authority)) = (base.scheme().cloned(), base.authority().cloned())
        else {
            return Err(UpstreamConfigError(format!(
                "{:?} needs a scheme and a host, such as https://api.openai.com/v1",
                config.base_url
            )));
        };
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(UpstreamConfigError(format!(
                "{scheme} is not http or https"
            )));
        }
        if config.late_answer > MAX_LATE_ANSWER {
            return Err(UpstreamConfigError(format!(
                "late_answer_seconds: at most {} (a day), not {}",
                MAX_LATE_ANSWER.as_secs(),
                config.late_answer.as_secs()
            )));
        }
        let credential_names = config
            .credential_headers
            .iter()
            .map(|name| {
                let parsed = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    UpstreamConfigError(format!(
                        "credential_headers: {name:?} is not a header name"
                    ))
                })?;
                if !config
                    .extra_headers
                    .iter()
                    .any(|(configured, _)| configured.eq_ignore_ascii_case(parsed.as_str()))
                {
                    // Most likely a misspelling, which would leave the
                    // real credential header sent beside an account's key.
                    return Err(UpstreamConfigError(format!(
                        "credential_headers names {name}, which is not one of the configured headers"
                    )));
                }
                Ok(parsed)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let byok_names = config
            .byok_headers
            .iter()
            .map(|name| {
                let parsed = http::HeaderName::from_bytes(name.as_bytes()).ok();
                match parsed {
                    Some(parsed)
                        if config.extra_headers.iter().any(|(configured, _)| {
                            configured.eq_ignore_ascii_case(parsed.as_str())
                        }) && !DEFAULT_CREDENTIAL_HEADERS.contains(&parsed.as_str())
                            && !credential_names.contains(&parsed) =>
                    {
                        Ok(parsed)
                    }
                    _ => Err(UpstreamConfigError(format!(
                        "byok_headers names {name:?}, which is not one of the configured headers, or is a credential"
                    ))),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (credential_headers, extra_headers): (Vec<_>, Vec<_>) = config
            .extra_headers
            .iter()
            .map(|(name, value)| {
                let parsed_name = http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| UpstreamConfigError(format!("{name:?} is not a header name")))?;
                // The gateway sets these itself; a config must not steer them.
                if matches!(
                    parsed_name.as_str(),
                    "authorization"
                        | "host"
                        | "content-length"
                        | "transfer-encoding"
                        | "connection"
                ) {
                    return Err(UpstreamConfigError(format!(
                        "the header {name} is set by the gateway, not the config"
                    )));
                }
                let mut parsed_value = HeaderValue::from_str(value.expose()).map_err(|_| {
                    UpstreamConfigError(format!("the value of header {name} cannot be sent"))
                })?;
                // Extra headers often carry credentials (an organisation, a project key).
                parsed_value.set_sensitive(true);
                Ok((parsed_name, parsed_value))
            })
            .collect::<Result<Vec<_>, UpstreamConfigError>>()?
            .into_iter()
            // Only a header declared safe goes beside an account's key: an
            // organisation or a second key header would put the account's
            // requests on the gateway's access.
            .partition(|(name, _)| !byok_names.contains(name));
        Ok(CheckedConfig {
            base,
            scheme,
            authority,
            extra_headers,
            credential_headers,
        })
    }
}

impl Upstream {
    /// A client for `config`.
    pub fn new(config: &UpstreamConfig) -> Result<Self, UpstreamConfigError> {
        let CheckedConfig {
            base,
            scheme,
            authority,
            extra_headers,
            credential_headers,
        } = config.checked()?;
        let sensitive = |text: &str| {
            let mut value = HeaderValue::from_str(text).map_err(|_| {
                UpstreamConfigError(
                    "the upstream API key has characters a header cannot carry".into(),
                )
            })?;
            value.set_sensitive(true);
            Ok::<_, UpstreamConfigError>(value)
        };
        let authorization = config
            .api_key
            .as_ref()
            .map(|key| sensitive(&format!("Bearer {}", key.expose())))
            .transpose()?;
        let api_key = config
            .api_key
            .as_ref()
            .map(|key| sensitive(key.expose()))
            .transpose()?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(config.connect_timeout));
        http.enforce_http(false);
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .build(https);
        Ok(Upstream {
            inner: Arc::new(Inner {
                client,
                scheme,
                authority,
                base_path: base.path().trim_end_matches('/').to_owned(),
                prefix_segments: normalized_segments(&config.gateway_prefix)
                    .into_iter()
                    .map(|segment| segment.to_ascii_lowercase())
                    .collect(),
                authorization,
                api_key,
                apis: config.apis,
                extra_headers,
                credential_headers,
                response_header_timeout: config.response_header_timeout,
                late_answer: config.late_answer,
                late_answers: Arc::new(tokio::sync::Semaphore::new(
                    config
                        .max_late_answers
                        .min(tokio::sync::Semaphore::MAX_PERMITS),
                )),
            }),
        })
    }
}

/// `modelgate_upstream_duration_seconds` by outcome.
static UPSTREAM_DURATIONS: crate::telemetry::HandleCache<&'static str, metrics::Histogram> =
    crate::telemetry::HandleCache::new();

impl Inner {
    /// The upstream request for `request`.
    fn outgoing(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(Request<Full<Bytes>>, HeaderValue), GatewayError> {
        let (mut parts, body) = request.into_parts();
        let segments = normalized_segments(parts.uri.path());
        let prefixed = segments.len() >= self.prefix_segments.len()
            && segments
                .iter()
                .zip(&self.prefix_segments)
                .all(|(segment, prefix)| segment.eq_ignore_ascii_case(prefix));
        if !prefixed {
            return Err(GatewayError::new(
                ErrorKind::NotFound,
                "this gateway forwards only paths under its API prefix",
            ));
        }
        let rest = &segments[self.prefix_segments.len()..];
        // In the case the layers compared them in: OpenAI-style paths are
        // lower case, and an upstream must not read another route.
        // No query: nothing a client adds there (a deployment, a version)
        // may steer the upstream past what the layers checked.
        let mut path = String::with_capacity(self.base_path.len() + 64);
        path.push_str(&self.base_path);
        for segment in rest {
            path.push('/');
            // The encoder's pieces, pushed without a String for each; a
            // segment already in lower case (the usual) is not copied.
            let lower = match segment.bytes().any(|byte| byte.is_ascii_uppercase()) {
                true => Cow::Owned(segment.to_ascii_lowercase()),
                false => Cow::Borrowed(segment.as_ref()),
            };
            path.extend(percent_encoding::utf8_percent_encode(&lower, SEGMENT));
        }
        if rest.is_empty() {
            path.push('/');
        }
        // The segments borrow the URI this replaces.
        drop(segments);
        let path_and_query: PathAndQuery = path.parse().map_err(|_| {
            GatewayError::new(
                ErrorKind::InvalidRequest,
                "the request path cannot be forwarded",
            )
        })?;
        parts.uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|_| {
                GatewayError::new(
                    ErrorKind::InvalidRequest,
                    "the request path cannot be forwarded",
                )
            })?;
        let id = request_id(&parts.headers);
        parts.headers = upstream_request_headers(&parts.headers);
        let headers = &mut parts.headers;
        for (name, value) in &self.extra_headers {
            headers.insert(name.clone(), value.clone());
        }
        // A Messages upstream takes its key as `x-api-key` and wants the
        // API's version.
        let messages_wire = parts.extensions.get::<WireApi>() == Some(&WireApi(ModelApi::Messages));
        if messages_wire && !headers.contains_key(ANTHROPIC_VERSION) {
            headers.insert(
                ANTHROPIC_VERSION,
                HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION),
            );
        }
        match parts.extensions.get::<CallerKey>() {
            // The account's key alone: none of the gateway's credentials
            // rides beside it.
            Some(CallerKey(caller)) if messages_wire => {
                headers.insert(X_API_KEY, caller.clone());
            }
            Some(CallerKey(caller)) => {
                let mut bearer = HeaderValue::from_bytes(&[b"Bearer ", caller.as_bytes()].concat())
                    .map_err(|_| {
                        GatewayError::new(ErrorKind::Internal, "the account's key cannot be sent")
                    })?;
                bearer.set_sensitive(true);
                headers.insert(AUTHORIZATION, bearer);
            }
            // Accounted as the account's own key (unpaid), yet nothing put
            // that key here: sending the gateway's credentials instead would
            // serve it free. Refused before anything is sent, so with
            // `upstream_reports_sending` it settles as never sent (a library
            // stack whose CreditGuard finds account keys but whose routing
            // does not send them).
            None if parts
                .extensions
                .get::<RequestContext>()
                .is_some_and(|context| context.credential.is_some()) =>
            {
                return Err(GatewayError::new(
                    ErrorKind::Internal,
                    "this request was accounted to the account's own provider key, which this upstream was not given; nothing was sent, and the operator must route account keys to their provider (a `providers` section with `\"byok\": true`)",
                ));
            }
            None => {
                match (messages_wire, &self.api_key, &self.authorization) {
                    (true, Some(key), _) => {
                        headers.insert(X_API_KEY, key.clone());
                    }
                    (false, _, Some(authorization)) => {
                        headers.insert(AUTHORIZATION, authorization.clone());
                    }
                    _ => {}
                }
                for (name, value) in &self.credential_headers {
                    headers.insert(name.clone(), value.clone());
                }
            }
        }
        headers.insert(X_REQUEST_ID.clone(), id.clone());
        // HTTP/1 to the upstream whatever the client spoke; the pool
        // negotiates HTTP/2 by ALPN where the upstream offers it.
        parts.version = http::Version::HTTP_11;
        Ok((Request::from_parts(parts, body), id))
    }
}

/// Anthropic's API key header.
const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");
/// Anthropic's API version header.
const ANTHROPIC_VERSION: http::HeaderName = http::HeaderName::from_static("anthropic-version");

impl Upstream {
    /// The APIs this upstream serves natively.
    pub fn apis(&self) -> ServedApis {
        self.inner.apis
    }
}

/// Characters a path segment keeps as they are.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':')
    .remove(b'@');

impl Service<Request<Full<Bytes>>> for Upstream {
    type Response = Response<Incoming>;
    type Error = GatewayError;
    type Future = BoxFuture<'static, Result<Response<Incoming>, GatewayError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The pool queues requests itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let attempt = RequestContext::of(&request)
                .and_then(|context| context.sent.as_ref())
                .map(SentUpstream::attempt);
            let (request, id) = inner.outgoing(request)?;
            let request = request.map(|body| SendingBody {
                inner: body,
                attempt: attempt.clone(),
            });
            let mut sent = Box::pin(inner.client.request(request));
            let started = std::time::Instant::now();
            let outcome = tokio::time::timeout(inner.response_header_timeout, sent.as_mut()).await;
            let label = match &outcome {
                Err(_) => "timeout",
                Ok(Err(error)) if error.is_connect() => "connect",
                Ok(Err(_)) => "request",
                Ok(Ok(response)) if response.status().is_success() => "ok",
                Ok(Ok(_)) => "error_status",
            };
            UPSTREAM_DURATIONS
                .get(&label, || {
                    let histogram = metrics::histogram!(
                        crate::telemetry::UPSTREAM_DURATION_SECONDS,
                        "outcome" => label
                    );
                    (label, histogram)
                })
                .record(started.elapsed().as_secs_f64());
            let mut response = match outcome {
                Err(_) => {
                    let left = attempt
                        .as_ref()
                        .is_some_and(|attempt| inner.leave_late_answer(attempt, sent));
                    let charged = match left {
                        true => format!(
                            "; the upstream had the request and may still answer it: it is charged what the upstream reports it used within {} s, else what it was held for (see its generation record, named by the X-Generation-Id header, or your activity)",
                            inner.late_answer.as_secs()
                        ),
                        false => String::new(),
                    };
                    return Err(upstream_failure(
                        ErrorKind::UpstreamTimeout,
                        "timeout",
                        format!(
                            "the upstream sent no response within {} s{charged}; retry with backoff",
                            inner.response_header_timeout.as_secs()
                        ),
                    ));
                }
                Ok(Err(error)) if error.is_connect() => {
                    // No connection, so nothing of the request left.
                    if let Some(attempt) = &attempt {
                        attempt.clear();
                    }
                    tracing::warn!(%error, "cannot connect to the upstream");
                    return Err(upstream_failure(
                        ErrorKind::Upstream,
                        "connect",
                        "the gateway cannot connect to the upstream; retry with backoff".to_owned(),
                    ));
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "the upstream request failed");
                    // Sent, then the connection failed: the upstream may
                    // have worked on it, and no answer can tell what it used.
                    let lost = attempt
                        .as_ref()
                        .is_some_and(|attempt| attempt.answer_late(LateAnswer::Lost));
                    let charged = match lost {
                        true => {
                            "; the upstream had the request, so it is charged what it was held for (see its generation record, named by the X-Generation-Id header, or your activity)"
                        }
                        false => "",
                    };
                    return Err(upstream_failure(
                        ErrorKind::Upstream,
                        "request",
                        format!("the upstream request failed{charged}; retry with backoff"),
                    ));
                }
                Ok(Ok(response)) => {
                    // An answer: the upstream had it, whatever it read.
                    if let Some(attempt) = &attempt {
                        attempt.mark();
                    }
                    response
                }
            };
            *response.headers_mut() = client_response_headers(response.headers());
            response.headers_mut().insert(X_REQUEST_ID.clone(), id);
            Ok(response)
        })
    }
}

impl Inner {
    /// Leaves the response still coming for `attempt` (sent, and timed
    /// out) to be read late, when a place is free; else a lost answer.
    /// Whether anything was left (the attempt was sent).
    fn leave_late_answer(
        &self,
        attempt: &UpstreamAttempt,
        coming: Pin<Box<hyper_util::client::legacy::ResponseFuture>>,
    ) -> bool {
        let permit = match self.late_answer.is_zero() {
            true => None,
            false => Arc::clone(&self.late_answers).try_acquire_owned().ok(),
        };
        let late = match permit {
            Some(permit) => LateAnswer::Coming {
                deadline: tokio::time::Instant::now() + self.late_answer,
                response: Box::pin(async move {
                    let mut response = coming.await.ok()?;
                    *response.headers_mut() = client_response_headers(response.headers());
                    Some(response.map(|body| body.map_err(Into::into).boxed_unsync()))
                }),
                permit: Some(permit),
            },
            None => {
                if !self.late_answer.is_zero() {
                    tracing::warn!(
                        "too many late answers waited for at once: this request is charged what it was held for"
                    );
                }
                LateAnswer::Lost
            }
        };
        attempt.answer_late(late)
    }
}

/// The request body as the upstream connection reads it: the connection
/// polls it only once it is established and has taken the request, so its
/// first frame marks the request's attempt sent.
struct SendingBody {
    inner: Full<Bytes>,
    attempt: Option<UpstreamAttempt>,
}

impl Body for SendingBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(attempt) = self.attempt.take() {
            attempt.mark();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn upstream_failure(kind: ErrorKind, failure: &'static str, message: String) -> GatewayError {
    GatewayError::new(kind, message).with_metadata("upstream_failure", failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ByokCredential;

    fn inner(base: &str) -> Arc<Inner> {
        let mut config = UpstreamConfig::new(base);
        config.api_key = Some("sk-upstream".into());
        Upstream::new(&config).unwrap().inner
    }

    fn forwarded(base: &str, path: &str) -> Result<Request<Full<Bytes>>, GatewayError> {
        let request = Request::post(path)
            .header("host", "gateway.example")
            .header("content-length", "2")
            .header("connection", "close")
            .header("http-referer", "https://app.example")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        inner(base).outgoing(request).map(|(request, _)| request)
    }

    #[tokio::test]
    async fn paths_are_the_checked_ones_under_the_base_url() {
        let request =
            forwarded("http://127.0.0.1:9000/v1", "/api/v1/chat/completions?x=1").unwrap();
        assert_eq!(
            request.uri(),
            "http://127.0.0.1:9000/v1/chat/completions",
            "no query goes up"
        );
        let request = forwarded("https://api.example/v1/", "/API/v1//chat/./completions").unwrap();
        assert_eq!(request.uri(), "https://api.example/v1/chat/completions");
        let request = forwarded("http://u:1/", "/api/v1/chat/completions").unwrap();
        assert_eq!(request.uri().path(), "/chat/completions");
        assert_eq!(
            forwarded("http://u:1/v1", "/other/path")
                .unwrap_err()
                .status(),
            404
        );
        assert_eq!(
            forwarded("http://u:1/v1", "/api/v1/../../etc")
                .unwrap_err()
                .status(),
            404
        );
    }

    #[tokio::test]
    async fn the_upstream_gets_its_own_key_and_no_connection_headers() {
        let request = forwarded("http://127.0.0.1:9000/v1", "/api/v1/chat/completions").unwrap();
        let headers = request.headers();
        assert_eq!(headers["authorization"], "Bearer sk-upstream");
        assert!(headers["authorization"].is_sensitive());
        assert_eq!(headers["http-referer"], "https://app.example");
        assert!(headers.get("host").is_none() && headers.get("connection").is_none());
        assert!(
            headers.get("content-length").is_none(),
            "the client sets it from the body"
        );
        assert!(headers.contains_key("x-request-id"));
        let mut config = UpstreamConfig::new("http://x/v1");
        config.api_key = Some("sk-secret".into());
        assert!(!format!("{config:?}").contains("sk-secret"));
    }

    /// A client whose provider's credentials are its key and three
    /// configured headers, beside one header that is none.
    fn with_credential_headers() -> Arc<Inner> {
        let mut config = UpstreamConfig::new("http://127.0.0.1:9000/v1");
        config.api_key = Some("sk-upstream".into());
        config.extra_headers = vec![
            ("X-Api-Key".into(), "gateway-x".into()),
            ("api-key".into(), "gateway-a".into()),
            ("x-goog-api-key".into(), "gateway-g".into()),
            ("x-title".into(), "modelgate".into()),
        ];
        config.credential_headers = vec!["X-Goog-Api-Key".into()];
        config.byok_headers = vec!["x-title".into()];
        Upstream::new(&config).unwrap().inner
    }

    fn sent(inner: &Inner, caller: Option<&str>) -> http::HeaderMap {
        let mut request = Request::post("/api/v1/chat/completions")
            .header("x-api-key", "from-the-client")
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Some(key) = caller {
            let value = HeaderValue::from_str(key).unwrap();
            request.extensions_mut().insert(CallerKey(value));
        }
        inner.outgoing(request).unwrap().0.headers().clone()
    }

    #[test]
    fn an_accounts_key_goes_alone_without_the_gateways_credentials() {
        let inner = with_credential_headers();
        let own = sent(&inner, None);
        assert_eq!(own["authorization"], "Bearer sk-upstream");
        assert_eq!(own["x-api-key"], "gateway-x");
        assert_eq!(own["api-key"], "gateway-a");
        assert_eq!(own["x-goog-api-key"], "gateway-g");
        assert_eq!(own["x-title"], "modelgate");
        let byok = sent(&inner, Some("sk-tenant"));
        assert_eq!(byok["authorization"], "Bearer sk-tenant");
        for name in ["x-api-key", "api-key", "x-goog-api-key"] {
            assert!(byok.get(name).is_none(), "{name} was sent: {byok:?}");
        }
        assert_eq!(byok["x-title"], "modelgate", "declared safe for BYOK: sent");
    }

    #[test]
    fn a_messages_upstream_gets_its_key_as_x_api_key_and_a_version() {
        let inner = inner_for(ServedApis::from_names(&["messages"]).unwrap());
        let outgoing = |caller: Option<&str>, version: Option<&str>| {
            let mut request = Request::post("/api/v1/messages");
            if let Some(version) = version {
                request = request.header("anthropic-version", version);
            }
            let mut request = request
                .header("anthropic-beta", "tools-2024")
                .header("authorization", "Bearer from-the-client")
                .body(Full::new(Bytes::new()))
                .unwrap();
            request.extensions_mut().insert(WireApi(ModelApi::Messages));
            if let Some(key) = caller {
                let value = HeaderValue::from_str(key).unwrap();
                request.extensions_mut().insert(CallerKey(value));
            }
            inner.outgoing(request).unwrap().0
        };
        let own = outgoing(None, Some("2023-01-01"));
        assert_eq!(own.uri().path(), "/v1/messages");
        assert_eq!(own.headers()["x-api-key"], "sk-upstream");
        assert!(own.headers()["x-api-key"].is_sensitive());
        assert!(own.headers().get("authorization").is_none());
        assert_eq!(own.headers()["anthropic-version"], "2023-01-01");
        assert_eq!(own.headers()["anthropic-beta"], "tools-2024");
        let byok = outgoing(Some("sk-ant-tenant"), None);
        assert_eq!(byok.headers()["x-api-key"], "sk-ant-tenant");
        assert!(byok.headers().get("authorization").is_none());
        assert_eq!(
            byok.headers()["anthropic-version"],
            DEFAULT_ANTHROPIC_VERSION
        );
    }

    fn inner_for(apis: ServedApis) -> Arc<Inner> {
        let mut config = UpstreamConfig::new("http://127.0.0.1:9/v1");
        config.api_key = Some(Redacted("sk-upstream".to_owned()));
        config.apis = apis;
        Upstream::new(&config).unwrap().inner
    }

    #[test]
    fn served_apis_read_from_names() {
        assert_eq!(
            ServedApis::from_names(&["chat", "embeddings"]),
            Ok(ServedApis::default())
        );
        let both = ServedApis::from_names(&["messages", "chat"]).unwrap();
        assert!(both.chat && both.messages && !both.embeddings);
        assert_eq!(both.wire_api(ModelApi::Messages), Some(ModelApi::Messages));
        let chat_only = ServedApis::from_names(&["chat"]).unwrap();
        assert_eq!(chat_only.wire_api(ModelApi::Messages), Some(ModelApi::Chat));
        assert_eq!(
            chat_only.wire_api(ModelApi::Responses),
            Some(ModelApi::Chat)
        );
        assert_eq!(chat_only.wire_api(ModelApi::Embeddings), None);
        let messages_only = ServedApis::from_names(&["messages"]).unwrap();
        assert_eq!(
            messages_only.wire_api(ModelApi::Chat),
            Some(ModelApi::Messages)
        );
        assert_eq!(messages_only.wire_api(ModelApi::Responses), None);
        let empty = ServedApis::from_names::<&str>(&[]).unwrap_err();
        assert!(empty.contains("empty"), "{empty}");
        let unknown = ServedApis::from_names(&["completions"]).unwrap_err();
        assert!(unknown.contains("\"completions\""), "{unknown}");
    }

    #[test]
    fn a_request_accounted_to_an_accounts_key_never_goes_with_the_gateways_instead() {
        let inner = with_credential_headers();
        let mut request = Request::post("/api/v1/chat/completions")
            .body(Full::new(Bytes::new()))
            .unwrap();
        RequestContext::of_mut(&mut request).credential =
            Some(ByokCredential::new("alpha", "sk-tenant-0001").unwrap());
        let error = inner.outgoing(request).unwrap_err();
        assert_eq!(error.status(), 500);
        assert!(
            error.message().contains("nothing was sent"),
            "{}",
            error.message()
        );
        assert!(!error.message().contains("sk-"), "{}", error.message());
    }

    #[test]
    fn credential_headers_must_name_configured_headers() {
        for (names, words) in [
            (vec!["x-goog-api-kye"], "not one of the configured headers"),
            (vec!["bad name"], "is not a header name"),
            (vec!["authorization"], "not one of the configured headers"),
        ] {
            let mut config = UpstreamConfig::new("http://127.0.0.1:9000/v1");
            config.extra_headers = vec![("x-goog-api-key".into(), "gateway-g".into())];
            config.credential_headers = names.iter().map(|name| name.to_string()).collect();
            let error = Upstream::new(&config).unwrap_err().to_string();
            assert!(error.contains(words), "{names:?}: {error}");
            assert!(error.contains("credential_headers"), "{error}");
            assert!(!error.contains("gateway-g"), "{error}");
        }
    }

    proptest::proptest! {
        #[test]
        fn no_credential_header_list_panics_and_a_listed_one_never_rides_with_a_callers_key(
            names in proptest::collection::vec(
                proptest::prop_oneof!["[A-Za-z0-9-]{1,12}", "[ -~]{0,12}"],
                0..4,
            ),
        ) {
            let mut config = UpstreamConfig::new("http://127.0.0.1:9000/v1");
            config.extra_headers = names
                .iter()
                .filter(|name| http::HeaderName::from_bytes(name.as_bytes()).is_ok())
                .filter(|name| !matches!(
                    name.to_ascii_lowercase().as_str(),
                    "authorization" | "host" | "content-length" | "transfer-encoding" | "connection"
                        | "x-request-id" | "accept-encoding"
                ))
                .map(|name| (name.clone(), "gateway-value".into()))
                .collect();
            config.credential_headers = names.clone();
            let Ok(upstream) = Upstream::new(&config) else {
                return Ok(());
            };
            let byok = sent(&upstream.inner, Some("sk-tenant"));
            for name in &names {
                proptest::prop_assert!(byok.get(name.as_str()).is_none(), "{} sent", name);
            }
        }
    }

    /// A loopback upstream that reads each request and answers `answer`
    /// (nothing at all when `None`); its base URL.
    async fn loopback(answer: Option<&'static [u8]>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 4096];
                    let _ = stream.read(&mut buffer).await;
                    match answer {
                        Some(answer) => {
                            let _ = stream.write_all(answer).await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        base
    }

    /// Sends one chat request through an `Upstream` at `base`: whether it
    /// answered, and whether the request was marked sent.
    async fn send_marked(base: &str) -> (Result<u16, String>, bool) {
        let mut config = UpstreamConfig::new(base);
        config.response_header_timeout = Duration::from_millis(300);
        let mut upstream = Upstream::new(&config).unwrap();
        let sent = SentUpstream::default();
        let mut request = Request::post("/api/v1/chat/completions")
            .body(Full::new(Bytes::from_static(b"{\"model\":\"m\"}")))
            .unwrap();
        RequestContext::of_mut(&mut request).sent = Some(sent.clone());
        let outcome = upstream.call(request).await;
        let outcome = outcome
            .map(|response| response.status().as_u16())
            .map_err(|error| {
                error.metadata()["upstream_failure"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            });
        (outcome, sent.is_marked())
    }

    #[tokio::test]
    async fn a_request_is_marked_sent_only_once_a_connection_takes_it() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refused = format!("http://{}/v1", closed.local_addr().unwrap());
        drop(closed);
        assert_eq!(
            send_marked(&refused).await,
            (Err("connect".to_owned()), false),
            "no connection: nothing left"
        );
        assert_eq!(
            send_marked(&loopback(None).await).await,
            (Err("timeout".to_owned()), true),
            "written, then no answer: the upstream may be working on it"
        );
        let answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            send_marked(&loopback(Some(answer)).await).await,
            (Ok(503), true)
        );
    }

    #[test]
    fn bad_base_urls_are_refused() {
        for base in ["", "api.openai.com/v1", "ftp://x/v1", "http://"] {
            assert!(Upstream::new(&UpstreamConfig::new(base)).is_err(), "{base}");
        }
    }
}
