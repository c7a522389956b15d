//! `ErrorMapper` and `BodyLimit` over real HTTP: a hyper server on loopback,
//! reqwest and raw TCP clients.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::http_server::serve;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use modelgate::body::BodyLimitLayer;
use modelgate::context::RequestContext;
use modelgate::error_mapper::ErrorMapperLayer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::{BoxError, ServiceBuilder, service_fn};

type UpstreamBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

fn full(bytes: impl Into<Bytes>) -> UpstreamBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// What the layers sit in front of: an echo for chat, and every kind of
/// failure an upstream produces.
async fn upstream(request: Request<Full<Bytes>>) -> Result<Response<UpstreamBody>, BoxError> {
    let path = request.uri().path().to_owned();
    let response = |status: u16, body: &'static str| {
        Response::builder().status(status).body(full(body)).unwrap()
    };
    Ok(match path.as_str() {
        "/api/v1/chat/completions" | "/echo" => {
            let context = RequestContext::of(&request);
            let model = context
                .and_then(|context| context.chat.as_ref())
                .map(|chat| chat.model.clone())
                .unwrap_or_default();
            let buffered = context
                .and_then(|context| context.body.as_ref())
                .map_or(0, Bytes::len);
            let framing = format!(
                "content-length={:?} transfer-encoding={:?}",
                request.headers().get("content-length"),
                request.headers().get("transfer-encoding")
            );
            let body = request.into_body().collect().await?.to_bytes();
            Response::builder()
                .header("x-model", model)
                .header("x-buffered-bytes", buffered)
                .header("x-framing", framing)
                .body(full(body))
                .unwrap()
        }
        "/fail/refused" => return Err(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))),
        "/fail/timeout" => return Err(Box::new(tower::timeout::error::Elapsed::new())),
        "/fail/overloaded" => return Err(Box::new(tower::load_shed::error::Overloaded::new())),
        "/fail/other" => return Err("the upstream client gave up".into()),
        "/panic" => panic!("a bug in an inner service"),
        "/upstream/html" => Response::builder()
            .status(502)
            .header("content-type", "text/html")
            .body(full("<html><head><title>x</title></head><body><h1>502 Bad Gateway</h1></body></html>"))
            .unwrap(),
        "/upstream/plain" => Response::builder()
            .status(503)
            .header("retry-after", "7")
            .header("x-ratelimit-reset", "1700000000")
            .header("x-secret-internal", "not for clients")
            .body(full("upstream overloaded"))
            .unwrap(),
        "/upstream/empty" => response(500, ""),
        "/upstream/json" => response(400, r#"{"detail": "unknown parameter: foo"}"#),
        "/upstream/openai" => response(
            429,
            r#"{"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}"#,
        ),
        "/upstream/canonical" => Response::builder()
            .status(429)
            .header("retry-after", "3")
            .header("content-type", "application/json")
            .body(full(
                r#"{"error":{"message":"slow down","type":"rate_limit_error","code":429,"metadata":{"limit_source":"account_rate"}}}"#,
            ))
            .unwrap(),
        "/upstream/404" => response(404, "<html><body>Not Found</body></html>"),
        "/upstream/429" => Response::builder()
            .status(429)
            .header("retry-after", "60")
            .body(full("slow down"))
            .unwrap(),
        "/upstream/gzip" => Response::builder()
            .status(500)
            .header("content-encoding", "gzip")
            .body(full(&b"\x1f\x8b\x08\x00binary"[..]))
            .unwrap(),
        "/upstream/stalled" => {
            // Headers, then a body that never comes.
            let stream = futures::stream::pending::<Result<http_body::Frame<Bytes>, BoxError>>();
            Response::builder()
                .status(503)
                .body(StreamBody::new(stream).boxed())
                .unwrap()
        }
        "/upstream/huge" => response(500, Box::leak("x".repeat(200_000).into_boxed_str())),
        "/stream" => {
            let chunks = ["data: one\n\n", "data: two\n\n", "data: [DONE]\n\n"]
                .map(|chunk| Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(chunk))));
            Response::new(StreamBody::new(futures::stream::iter(chunks)).boxed())
        }
        _ => response(200, "ok"),
    })
}

async fn gateway() -> SocketAddr {
    let service = ServiceBuilder::new()
        .layer(ErrorMapperLayer::new())
        .layer(
            BodyLimitLayer::new()
                .max_body_bytes(1024)
                .read_timeout(Duration::from_secs(5)),
        )
        .service(service_fn(upstream));
    serve(service).await
}

async fn get(address: SocketAddr, path: &str) -> reqwest::Response {
    reqwest::get(format!("http://{address}{path}"))
        .await
        .unwrap()
}

async fn canonical(response: reqwest::Response) -> (StatusCode, http::HeaderMap, Value) {
    let status = response.status();
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/json", "{status}");
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert_eq!(error["code"], status.as_u16(), "{body}");
    assert!(error["metadata"].is_object(), "{body}");
    (status, headers, body)
}

#[tokio::test]
async fn a_chat_request_reaches_the_upstream_byte_for_byte() {
    let address = gateway().await;
    let body = "{\"model\":\"openai/gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 ü 😀 \\\"q\\\" \\\\\"}],\"custom\":{\"kept\":true}}";
    let response = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("content-type", "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-model"], "openai/gpt-4o");
    assert_eq!(
        response.headers()["x-buffered-bytes"],
        body.len().to_string().as_str()
    );
    assert_eq!(response.bytes().await.unwrap(), body.as_bytes());
}

#[tokio::test]
async fn bad_chat_requests_get_specific_400_and_422() {
    let address = gateway().await;
    let client = reqwest::Client::new();
    let post = |body: &'static str, content_type: &'static str| {
        client
            .post(format!("http://{address}/api/v1/chat/completions"))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let (status, _, body) = canonical(
        post("{\"model\": \"m\",\n \"messages\": [}", "application/json")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("line 2, column"),
        "{body}"
    );

    let (status, _, body) = canonical(
        post(
            r#"{"model":"p/m","messages":[{"role":"user","content":null}]}"#,
            "application/json",
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("content")
    );

    let (status, _, body) = canonical(
        post(
            r#"{"model":"p/m","messages":[{"role":"user","content":"x"}],"temperature":9}"#,
            "application/json",
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(body["error"]["type"], "invalid_parameter");
    assert_eq!(body["error"]["metadata"]["param"], "temperature");

    let (status, _, body) =
        canonical(post(r#"{"model":"p/m"}"#, "text/plain").await.unwrap()).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Content-Type: application/json")
    );
}

/// Sends raw bytes and reads the whole response (the server closes or
/// answers `Connection: close` after an early rejection).
async fn raw_exchange(address: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = stream.read(&mut buffer).await.unwrap_or(0);
        if read == 0 {
            break;
        }
        response.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&response);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|length| length.trim().parse::<usize>().ok());
            if length.is_some_and(|length| body.len() >= length) {
                break;
            }
        }
    }
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn a_declared_length_over_the_limit_is_refused_before_reading() {
    let address = gateway().await;
    // Headers only: the body is never sent, so an answer proves nothing was awaited.
    let response = raw_exchange(
        address,
        b"POST /api/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 10000000\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(response.contains("\"payload_too_large\""), "{response}");
    assert!(response.contains("1024 bytes"), "{response}");
}

#[tokio::test]
async fn a_chunked_body_running_over_the_limit_gets_413() {
    let address = gateway().await;
    let mut request = b"POST /api/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        request.extend_from_slice(b"200\r\n");
        request.extend_from_slice(&[b' '; 0x200]);
        request.extend_from_slice(b"\r\n");
    }
    let response = raw_exchange(address, &request).await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(response.contains("\"code\":413"), "{response}");
}

#[tokio::test(start_paused = true)]
async fn a_body_that_stops_arriving_gets_408() {
    let address = gateway().await;
    // 20 of 100 announced bytes, then silence; the paused clock jumps to the timeout.
    let response = raw_exchange(
        address,
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"model\": \"openai/g",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(response.contains("\"request_timeout\""), "{response}");
}

#[tokio::test]
async fn inner_errors_become_502_503_504() {
    let address = gateway().await;
    for (path, status, kind) in [
        ("/fail/refused", 502, "upstream_error"),
        ("/fail/timeout", 504, "upstream_timeout"),
        ("/fail/overloaded", 503, "service_unavailable"),
        ("/fail/other", 502, "upstream_error"),
    ] {
        let (actual, _, body) = canonical(get(address, path).await).await;
        assert_eq!(actual, status, "{path}");
        assert_eq!(body["error"]["type"], kind, "{path}");
    }
}

#[tokio::test]
async fn a_panic_becomes_500_and_the_server_keeps_serving() {
    let address = gateway().await;
    let (status, _, body) = canonical(get(address, "/panic").await).await;
    assert_eq!(status, 500);
    assert_eq!(body["error"]["type"], "api_error");
    assert_eq!(get(address, "/ok").await.status(), 200);
}

#[tokio::test]
async fn upstream_error_bodies_are_rewritten_keeping_status_and_retry_after() {
    let address = gateway().await;
    let (status, _, body) = canonical(get(address, "/upstream/html").await).await;
    assert_eq!(status, 502);
    assert_eq!(
        body["error"]["metadata"]["upstream_message"],
        "502 Bad Gateway"
    );

    let (status, headers, body) = canonical(get(address, "/upstream/plain").await).await;
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(headers["x-ratelimit-reset"], "1700000000");
    assert!(headers.get("x-secret-internal").is_none());
    assert_eq!(
        body["error"]["metadata"]["upstream_message"],
        "upstream overloaded"
    );

    let (status, _, body) = canonical(get(address, "/upstream/empty").await).await;
    assert_eq!(status, 500);
    assert!(body["error"]["metadata"].get("upstream_message").is_none());

    let (status, _, body) = canonical(get(address, "/upstream/json").await).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["error"]["metadata"]["upstream_message"],
        "unknown parameter: foo"
    );

    let (status, _, body) = canonical(get(address, "/upstream/openai").await).await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(
        body["error"]["metadata"]["upstream_message"],
        "Rate limit reached"
    );

    let (status, _, body) = canonical(get(address, "/upstream/404").await).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["metadata"]["upstream_message"], "Not Found");

    let (status, _, body) = canonical(get(address, "/upstream/huge").await).await;
    assert_eq!(status, 500);
    assert!(
        body["error"]["metadata"]["upstream_message"]
            .as_str()
            .unwrap()
            .contains("too large")
    );
}

#[tokio::test]
async fn canonical_errors_and_successes_pass_through_untouched() {
    let address = gateway().await;
    let response = get(address, "/upstream/canonical").await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(
        response.bytes().await.unwrap(),
        r#"{"error":{"message":"slow down","type":"rate_limit_error","code":429,"metadata":{"limit_source":"account_rate"}}}"#
    );
    let response = get(address, "/stream").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.bytes().await.unwrap(),
        "data: one\n\ndata: two\n\ndata: [DONE]\n\n"
    );
}

#[tokio::test]
async fn axum_serves_the_layers_in_front_of_its_router() {
    use axum::routing::post;
    use axum::{Extension, Router};

    async fn chat(Extension(context): Extension<RequestContext>) -> String {
        let chat = context.chat.expect("BodyLimit parsed it");
        format!("model={} stream={}", chat.model, chat.stream)
    }

    let router: Router = Router::new()
        .route("/api/v1/chat/completions", post(chat))
        .layer(
            ServiceBuilder::new()
                .layer(ErrorMapperLayer::new())
                .layer(BodyLimitLayer::new().max_body_bytes(256)),
        );
    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
        let router = router.clone();
        async move { Ok::<_, Infallible>(tower::ServiceExt::oneshot(router, request).await.unwrap()) }
    });
    let address = serve(service).await;
    let client = reqwest::Client::new();
    let url = format!("http://{address}/api/v1/chat/completions");
    let ok = client
        .post(&url)
        .header("content-type", "application/json")
        .body(json!({"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "stream": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().await.unwrap(), "model=openai/gpt-4o stream=true");
    let too_big = client
        .post(&url)
        .header("content-type", "application/json")
        .body(vec![b' '; 1000])
        .send()
        .await
        .unwrap();
    let (status, _, _) = canonical(too_big).await;
    assert_eq!(status, 413);
}

#[tokio::test]
async fn every_spelling_of_the_chat_path_is_parsed() {
    let address = gateway().await;
    let client = reqwest::Client::new();
    for path in [
        "/api/v1/chat/%63ompletions",
        "/API/V1/CHAT//Completions/",
        "/api/v1/chat/completions/.",
        "/api/v1/chat/completions/x/..",
        "/api/v1/chat/completions?x=1",
    ] {
        let response = client
            .post(format!("http://{address}{path}"))
            .header("content-type", "application/json")
            .body(r#"{"model": "p/m", "messages": []}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{path} must not skip validation");
    }
}

#[tokio::test]
async fn every_chat_rejection_over_http() {
    let address = gateway().await;
    let client = reqwest::Client::new();
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "x"}]}),
            400,
            "model",
        ),
        // A value of the wrong type is 422, as the error seed lists type
        // mismatches; a missing field stays 400.
        (
            json!({"model": 5, "messages": [{"role": "user", "content": "x"}]}),
            422,
            "model",
        ),
        (json!({"model": "p/m", "messages": "hi"}), 422, "messages"),
        (
            json!({"model": "p/m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
            422,
            "stream",
        ),
        (json!({"model": "p/m", "messages": []}), 400, "messages"),
        (
            json!({"model": "p/m", "messages": [{"role": "robot", "content": "x"}]}),
            400,
            "messages[0].role",
        ),
        (
            json!({"model": "p/m", "messages": [{"role": "user", "content": "x"}], "top_p": 2}),
            422,
            "top_p",
        ),
        (
            json!({"model": "p/m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            422,
            "max_tokens",
        ),
        (
            json!({"model": "p/m", "messages": [{"role": "user", "content": "x"}], "n": 0}),
            422,
            "n",
        ),
        (
            json!({"model": "p/m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "o", "strict": true, "schema": {"type": "object", "properties": {"a": {}}, "additionalProperties": false}}}}),
            400,
            "response_format.json_schema.schema",
        ),
    ];
    for (body, status, named) in cases {
        let response = client
            .post(format!("http://{address}/api/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let (actual, _, error) = canonical(response).await;
        assert_eq!(actual, status, "{body}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(named),
            "{body}: {error}"
        );
    }
}

#[tokio::test]
async fn a_body_exactly_at_the_limit_passes_with_its_length() {
    let address = gateway().await;
    let head = r#"{"model":"p/m","messages":[{"role":"user","content":""#;
    let tail = r#""}]}"#;
    let body = format!("{head}{}{tail}", "x".repeat(1024 - head.len() - tail.len()));
    assert_eq!(body.len(), 1024);
    // Sent chunked: the inner service sees a plain Content-Length.
    let chunks = body
        .clone()
        .into_bytes()
        .chunks(100)
        .map(|chunk| Ok::<_, std::io::Error>(chunk.to_vec()))
        .collect::<Vec<_>>();
    let response = reqwest::Client::new()
        .post(format!("http://{address}/api/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-framing"],
        "content-length=Some(\"1024\") transfer-encoding=None"
    );
    assert_eq!(response.bytes().await.unwrap(), body.as_bytes());
}

#[tokio::test]
async fn an_upstream_429_keeps_its_retry_after() {
    let address = gateway().await;
    let (status, headers, body) = canonical(get(address, "/upstream/429").await).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "60");
    assert_eq!(body["error"]["metadata"]["limit_source"], "upstream");
    assert_eq!(body["error"]["metadata"]["upstream_message"], "slow down");
}

#[tokio::test]
async fn a_compressed_error_body_is_not_shown_and_its_encoding_dropped() {
    let address = gateway().await;
    let client = reqwest::Client::builder().build().unwrap();
    let response = client
        .get(format!("http://{address}/upstream/gzip"))
        .send()
        .await
        .unwrap();
    assert!(response.headers().get("content-encoding").is_none());
    let (status, _, body) = canonical(response).await;
    assert_eq!(status, 500);
    assert!(
        body["error"]["metadata"]["upstream_message"]
            .as_str()
            .unwrap()
            .contains("compressed")
    );
}

#[tokio::test(start_paused = true)]
async fn a_stalled_error_body_is_answered_after_its_timeout() {
    let address = gateway().await;
    let (status, _, body) = canonical(get(address, "/upstream/stalled").await).await;
    assert_eq!(status, 503);
    assert!(
        body["error"]["metadata"]["upstream_message"]
            .as_str()
            .unwrap()
            .contains("too slow")
    );
}
